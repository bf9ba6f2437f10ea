"""Redraw the results tables in benchmark/README.md and results/chart.png from results/*.json."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
LOCOMO_BEGIN, LOCOMO_END = "<!-- locomo:begin -->", "<!-- locomo:end -->"
CLINIC_BEGIN, CLINIC_END = "<!-- clinic:begin -->", "<!-- clinic:end -->"
# The brief's published funes figures (funes 1.8, 4 CPUs, 4 GB, one process per call).
FUNES_PUBLISHED = (
    "| funes 1.8 (the brief, 4 CPUs) | 1,000-10,000 | 91-100% | 100% | ~200 ms | | 240 MB "
    "| 20 min, 2 GB (10,000) | |"
)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.0f}%"


def table(results: list[dict[str, Any]], published: bool = True) -> str:
    """One row per run; ``published`` adds the brief's funes figures (for the ops history)."""
    lines = [
        "| engine | conversations | hit@3 long / short | hit@8 long / short "
        "| e2e p50 / p95 (k=3, short) | engine alone p50 / p95 (short) | server RSS "
        "| load (how, time, peak RSS) | disk per user |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: (r["engine"], r["size"])):
        how = "backfill" if "backfill_peak_rss_mb" in r else "POST /turns"
        peak = f", {r['backfill_peak_rss_mb']} MB" if "backfill_peak_rss_mb" in r else ""
        lines.append(
            f"| {r['engine']} | {r['size']:,} "
            f"| {_pct(r.get('hit@3_long'))} / {_pct(r.get('hit@3_short'))} "
            f"| {_pct(r.get('hit@8_long'))} / {_pct(r.get('hit@8_short'))} "
            f"| {r['e2e_k3_short']['p50_ms']} / {r['e2e_k3_short']['p95_ms']} ms "
            f"| {r['engine_short']['p50_ms']} / {r['engine_short']['p95_ms']} ms "
            f"| {r['server_rss_mb']} MB | {how}, {r['load_s']} s{peak} "
            f"| {r['disk_per_user_mb']} MB |"
        )
    if published:
        lines.append(FUNES_PUBLISHED)
    machines = sorted({f"{r['machine']} ({r['date']})" for r in results})
    lines += ["", "Measured on: " + "; ".join(machines) + "."]
    return "\n".join(lines)


def hits_table(results: list[dict[str, Any]], env: dict[str, str]) -> str:
    """One row per history and engine: hit@3 and hit@8, long and short, and how many questions
    were answered "Nothing relevant found" at k=3 (the similarity floor: a miss at every k). The
    heading names the settings the servers ran with (``--env``; none: the defaults) and the
    machine."""
    settings = ", ".join(f"{key}={value}" for key, value in sorted(env.items()))
    lines = [
        f"Settings: {settings or 'defaults'}",
        "",
        "| history | engine | conversations | questions | hit@3 long / short "
        "| hit@8 long / short | nothing found long / short |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['history']} | {r['engine']} | {r['size']:,} | {r['questions']} "
            f"| {_pct(r.get('hit@3_long'))} / {_pct(r.get('hit@3_short'))} "
            f"| {_pct(r.get('hit@8_long'))} / {_pct(r.get('hit@8_short'))} "
            f"| {r.get('nothing@3_long', '-')} / {r.get('nothing@3_short', '-')} |"
        )
    machines = sorted({r["machine"] for r in results})
    loads = [" ".join(str(x) for x in r["load_average_at_end"]) for r in results]
    lines += [
        "",
        f"Measured on: {'; '.join(machines)}; load average at the ends: {', '.join(loads)}.",
    ]
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (quality, speed) = plt.subplots(1, 2, figsize=(11, 4))
    for engine in sorted({r["engine"] for r in results}):
        rows = sorted((r for r in results if r["engine"] == engine), key=lambda r: r["size"])
        sizes = [r["size"] for r in rows]
        for key, style in (("hit@3_long", "o-"), ("hit@3_short", "o--"),
                           ("hit@8_long", "s-"), ("hit@8_short", "s--")):  # fmt: skip
            quality.plot(sizes, [r[key] * 100 for r in rows], style, label=f"{engine} {key}")
        for leg, name in (("e2e_k3_short", "MCP call"), ("engine_short", "engine alone")):
            for key, style in (("p50_ms", "o-"), ("p95_ms", "s--")):
                speed.plot(sizes, [r[leg][key] for r in rows], style,
                           label=f"{engine} {name} {key[:3]}")  # fmt: skip
    quality.set(xscale="log", xlabel="conversations", ylabel="hit rate (%)", title="Quality",
                ylim=(80, 101))  # fmt: skip
    speed.set(xscale="log", xlabel="conversations", ylabel="ms", ylim=(0, None),
              title="Recall latency, short queries (k=3)")  # fmt: skip
    quality.legend(fontsize=7)
    speed.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def locomo_tables(results: list[dict[str, Any]]) -> str:
    from benchmark.locomo import table as locomo_table

    parts = []
    for r in sorted(results, key=lambda r: r["engine"]):
        evidence, photos = r["evidence"], r["misses_with_evidence_only_on_photo_turns"]
        parts += [
            f"**{r['engine']}**, {r['data']}: {len(r['histories'])} histories, {r['sessions']} "
            f"sessions, {r['turns']:,} turns, {r['questions']} questions; "
            f"loaded by {r['load']['how']} in {r['load']['load_s']} s; "
            f"tool call p50 / p95 {r['latency_k3']['p50_ms']} / {r['latency_k3']['p95_ms']} ms "
            f"(k=3); run {r['wall_s'] / 60:.0f} min.",
            "",
            locomo_table(r),
            "",
            f"Misses whose evidence turns all share a photo (the caption is not loaded; "
            f"{r['turns_with_images']:,} of the turns share one): {photos['k3']} at k=3, "
            f"{photos['k8']} at k=8. Evidence references: {evidence['references']}, "
            f"{evidence['normalised']} split or respelled to resolve, {evidence['unresolved']} "
            f"naming no turn (left out); questions left with no evidence turn (always a miss): "
            f"{evidence['questions_without_evidence']}. Measured on {r['machine']} ({r['date']}).",
            "",
        ]
    return "\n".join(parts).rstrip()


def _replace(text: str, begin: str, end: str, body: str) -> str:
    block = f"{begin}\n{body}\n{end}"
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)


def write_report(results_dir: Path, *, synthetic_too: bool = True, draw_chart: bool = True) -> None:
    """The tables from results/*.json: the synthetic runs (and the chart, unless not
    `synthetic_too` or not `draw_chart`: matplotlib is a benchmark extra, not a test one) and the
    LoCoMo runs (locomo-*.json). Local files (*.local.json, ignored by git) hold what may not be
    committed and are not read."""
    results = [
        (p.name, json.loads(p.read_text()))
        for p in sorted(results_dir.glob("*.json"))
        if not p.name.endswith(".local.json")
    ]
    synthetic = [r for name, r in results if not name.startswith("locomo-")]
    # The held-out history ("clinic", history_clinic.py) has its own table and no chart.
    clinic = [r for r in synthetic if r.get("history") == "clinic"]
    synthetic = [r for r in synthetic if r.get("history", "ops") == "ops"]
    locomo = [r for name, r in results if name.startswith("locomo-")]
    readme = results_dir.parent / "README.md"
    text = readme.read_text()
    if synthetic and synthetic_too:
        text = _replace(text, BEGIN, END, table(synthetic))
        if draw_chart:
            chart(synthetic, results_dir / "chart.png")
    if clinic and synthetic_too:
        text = _replace(text, CLINIC_BEGIN, CLINIC_END, table(clinic, published=False))
    if locomo:
        text = _replace(text, LOCOMO_BEGIN, LOCOMO_END, locomo_tables(locomo))
    readme.write_text(text)
