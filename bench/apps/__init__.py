"""Foreign-app diagnosis benchmark (issue 26 item 6): fault families planted in an HF Trainer
app, a Lightning app and a plain PyTorch loop, scored held-out first (bench/README.md)."""
