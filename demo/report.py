"""The demo's report (``demo/loop.py``): per tenant, round and version, the figures of each
session as text, JSON and a PNG chart, and each experiment's decision."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdev import Summary


@dataclass
class Row:
    """One line of the report: a session's figures for one tenant and version."""

    tenant: str
    round: int
    phase: str  # "production" (the feedback that trains) or "A/B control" / "A/B candidate"
    version: str
    summary: Summary


def _fmt(estimate: Any, percent: bool = True) -> str:
    if estimate.n == 0 or estimate.value != estimate.value:
        return "n/a"
    if percent:
        return f"{estimate.value:.1%} [{estimate.low:.1%}, {estimate.high:.1%}]"
    return f"{estimate.value:+.3f} [{estimate.low:+.3f}, {estimate.high:+.3f}]"


def write_report(
    rows: list[Row], experiments: list[dict[str, Any]], out: Path, elapsed_s: float, dashboard: str
) -> None:
    """``report.txt``, ``report.json`` and ``report.png`` under ``out``, and the text printed."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"Strop demo report ({elapsed_s / 60:.1f} minutes)",
        "",
        "Per tenant, round and version: accept rate of shown suggestions, suggestions shown per request,",
        "accepted per request (Wilson 95% intervals) and mean reward per request (normal 95% interval).",
        "",
        f"{'tenant':<10} {'round':>5}  {'session':<14} {'version':<16} {'requests':>8}  {'accept rate of shown':<24}"
        f"{'shown/request':<24}{'accepted/request':<24}{'reward/request'}",
    ]
    for r in rows:
        s = r.summary
        lines.append(
            f"{r.tenant:<10} {r.round:>5}  {r.phase:<14} {r.version:<16} {s.requests:>8}  {_fmt(s.accept_rate):<24}"
            f"{_fmt(s.shown_per_request):<24}{_fmt(s.accepted_per_request):<24}{_fmt(s.mean_reward, False)}"
        )
    lines += ["", "Experiments:"]
    for e in experiments:
        lines.append(
            f"  {e['tenant']} round {e['round']}: experiment {e['id']}, "
            f"version {e['candidate']} vs {e['control']}: "
            f"{e['action']} ({e['status']}); production is now {e['production_after']}. {e['reason']}"
        )
    if not experiments:
        lines.append("  none (no candidate passed the gate)")
    lines += ["", f"Dashboard: {dashboard}"]
    text = "\n".join(lines) + "\n"
    (out / "report.txt").write_text(text)
    (out / "report.json").write_text(
        json.dumps(
            {
                "rows": [
                    {
                        "tenant": r.tenant,
                        "round": r.round,
                        "phase": r.phase,
                        "version": r.version,
                        "requests": r.summary.requests,
                        "shown": r.summary.shown,
                        "accepted": r.summary.accepted,
                        "mean_reward": r.summary.mean_reward.value,
                    }
                    for r in rows
                ],
                "experiments": experiments,
            },
            indent=2,
        )
    )
    chart(rows, out / "report.png")
    print()
    print(text)
    print(f"    report: {out / 'report.txt'}, chart: {out / 'report.png'}")


def chart(rows: list[Row], path: Path) -> None:
    """Accept rate of shown suggestions and accepted per request, each with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.summary.requests]
    labels = [f"{r.tenant} r{r.round}\n{r.phase}\n{r.version.replace('the base model', 'base')}" for r in shown]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(shown) + 2), 4.8))
    for ax, name, title in (
        (axes[0], "accept_rate", "accept rate of shown suggestions"),
        (axes[1], "accepted_per_request", "accepted per request"),
    ):
        values: list[float] = []
        errors: list[list[float]] = [[], []]
        colours: list[str] = []
        for r in shown:
            e = getattr(r.summary, name)
            ok = e.n > 0 and e.value == e.value
            values.append(e.value if ok else 0.0)
            # Wilson bounds can sit a rounding error inside the value (at 0 or 1): never below zero.
            errors[0].append(max(0.0, e.value - e.low) if ok else 0.0)
            errors[1].append(max(0.0, e.high - e.value) if ok else 0.0)
            colours.append("#9aa5b1" if r.phase != "A/B candidate" else "#2f6fdf")
        ax.bar(range(len(shown)), values, yerr=errors, color=colours, capsize=4)
        ax.set_xticks(range(len(shown)), labels, fontsize=7)
        ax.set_title(title)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set_ylim(0, max(0.05, max((v + hi for v, hi in zip(values, errors[1], strict=True)), default=0) * 1.15))
    fig.suptitle("Strop demo: production and A/B arms per tenant and round (95% intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
