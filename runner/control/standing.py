"""Where an investigation stands, shown on its parent run: every baseline, verdict and reset
rewrites the run's name, description and saved views, so the MLflow UI follows the investigation."""

from __future__ import annotations

from hyprun.runner.store.investigation import STRIKES, State, Store, findings_lines, save_views


def settle(store: Store, state: State) -> State:
    """The parent run follows the investigation, not its baseline: its description says where
    it stands, its name the outcome, and it is running while a test runs and ends (end time:
    now) when none does. Its saved views follow it too (their charts' ranges fit its curves)."""
    state = store.refresh(state)
    save_views(store, state)
    store.note(state.run_id, summary(state))
    store.rename(state.run_id, f"{state.name} · {headline(state)}")
    if not any(t.verdict == "running" for t in state.tests):
        store.finish(state.run_id)
    return state


def headline(state: State) -> str:
    """The investigation at a glance, as it stands now: its escalation (even after an earlier
    fix: three rejections since are the latest word), or its fix, or its strikes so far."""
    if state.escalated:
        since = f" since H{state.confirmed[-1].number}'s fix" if state.confirmed else ""
        return f"escalated after {state.strikes} rejections{since}"
    if state.confirmed:
        fix = state.confirmed[-1]
        since = f"; {state.strikes}/{STRIKES} strikes since" if state.strikes else ""
        effect = fix.tags.get("hyprun.effect", "")
        return f"fixed by H{fix.number} {' '.join(fix.fix)} ({effect}){since}"
    running = sum(t.verdict == "running" for t in state.tests)
    done = f"{len(state.tests) - running} tested, {state.strikes}/{STRIKES} strikes"
    return done + (f", {running} running" if running else "")


def summary(state: State) -> str:
    """The parent run's description (Markdown in the MLflow UI): where the investigation stands,
    what triage found, what no test has touched yet, and each test with its effect."""
    lines = [
        f"**Investigation {state.name}**: {state.strikes}/{STRIKES} strikes"
        + (" — ESCALATED: a human decides next" if state.escalated else ""),
        "",
        *[f"- {line}" for line in findings_lines(state)],
        "",
    ]
    for t in state.tests:
        effect = t.tags.get("hyprun.effect", "")
        early = f" (stopped early: {t.seeds_shown} seeds)" if " of " in t.seeds_shown else ""
        lines.append(
            f"- H{t.number} `{' '.join(t.delta)}`: {t.verdict}"
            + (f" · {effect}" if effect else "")
            + early
        )
    return "\n".join(lines).strip() + "\n"
