"""The one results writer: figures with their reference point, ratio and target;
the command line every benchmark script shares; the table, results.md and results.json.

A figure keeps every round's value. What is shown is the median with min–max;
a ratio is the median of per-round ratios, each taken against the reference
measured in the same round, so slow drift of a noisy machine cancels out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

import zns

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Target:
    """A goal from the issue: `on` the ratio or the value itself, `op` '>=' or '<='."""

    on: str
    op: str
    bound: float

    def describe(self, unit: str) -> str:
        sign = "≥" if self.op == ">=" else "≤"
        if self.on == "ratio":
            return f"{sign} {self.bound:g}×"
        return f"{sign} {self.bound:g} {unit}"

    def met(self, value: float, ratio: float | None) -> bool:
        x = ratio if self.on == "ratio" else value
        if x is None:
            return False
        return x >= self.bound if self.op == ">=" else x <= self.bound


@dataclass
class Figure:
    name: str
    unit: str
    rounds: list[float]
    reference: str = ""  # what the value is compared with
    reference_rounds: list[float] = field(default_factory=list)
    target: Target | None = None
    note: str = ""

    @property
    def value(self) -> float:
        return statistics.median(self.rounds)

    @property
    def reference_value(self) -> float | None:
        return statistics.median(self.reference_rounds) if self.reference_rounds else None

    @property
    def ratios(self) -> list[float]:
        refs = self.reference_rounds
        if not refs:
            return []
        if len(refs) == 1:
            refs = refs * len(self.rounds)
        return [v / r for v, r in zip(self.rounds, refs) if r]

    @property
    def ratio(self) -> float | None:
        ratios = self.ratios
        return statistics.median(ratios) if ratios else None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value, self.ratio)

    def as_json(self) -> dict[str, Any]:
        ratios = self.ratios
        return {
            "name": self.name, "unit": self.unit, "median": self.value,
            "min": min(self.rounds), "max": max(self.rounds), "rounds": self.rounds,
            "reference": self.reference or None, "reference_median": self.reference_value,
            "reference_rounds": self.reference_rounds or None,
            "ratio": self.ratio, "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "target": self.target.describe(self.unit) if self.target else None,
            "target_on": self.target.on if self.target else None,
            "met": self.met, "note": self.note or None,
        }


@dataclass
class BenchResult:
    name: str
    title: str
    method: str  # markdown: how it was measured
    figures: list[Figure] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


@dataclass
class RunConfig:
    quick: bool
    rounds: int
    workdir: Path  # scratch space for server logs and KV files

    def log(self, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)


BenchFn = Callable[[RunConfig], BenchResult]


# --- formatting --------------------------------------------------------------


def fmt(x: float | None) -> str:
    if x is None:
        return "—"
    magnitude = abs(x)
    if magnitude >= 1000:
        return f"{x:,.0f}"
    if magnitude >= 100:
        return f"{x:.0f}"
    if magnitude >= 10:
        return f"{x:.1f}"
    if magnitude >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _row(fig: Figure) -> list[str]:
    spread = f"{fmt(min(fig.rounds))}–{fmt(max(fig.rounds))}" if len(fig.rounds) > 1 else ""
    ratios = fig.ratios
    ratio = ""
    if fig.ratio is not None:
        ratio = f"{fig.ratio:.3g}×"
        if len(ratios) > 1:
            ratio += f" ({min(ratios):.3g}–{max(ratios):.3g})"
    reference = ""
    if fig.reference:
        reference = fig.reference
        if fig.reference_value is not None:
            reference += f": {fmt(fig.reference_value)}"
    met = {None: "", True: "yes", False: "**no**"}[fig.met]
    target = fig.target.describe(fig.unit) if fig.target else ""
    return [fig.name, f"{fmt(fig.value)} {fig.unit}", spread, reference, ratio, target, met]


HEADER = ["figure", "median", "min–max", "reference", "ratio", "target", "met"]


def text_table(results: Sequence[BenchResult]) -> str:
    rows = [HEADER]
    for result in results:
        rows.append([f"[{result.name}]", "", "", "", "", "", ""])
        if result.error:
            rows.append([f"FAILED: {result.error.splitlines()[-1]}", "", "", "", "", "", ""])
        rows.extend([cell.replace("**", "") for cell in _row(fig)] for fig in result.figures)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
            text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "nproc": os.cpu_count(), "cpu": model or platform.processor(),
        "platform": platform.platform(), "load_average": os.getloadavg(),
        "python": platform.python_version(), "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(), "msgspec": msgspec.__version__, "zns": zns.__version__,
        "commit": commit,
    }


def markdown(results: Sequence[BenchResult], info: dict[str, Any], config: RunConfig) -> str:
    mode = "quick (smoke) parameters" if config.quick else "full parameters"
    load = ", ".join(f"{x:.2f}" for x in info["load_average"])
    lines = [
        "# zns benchmark results",
        "",
        f"Written by `make bench` (`python -m bench.run_all`) on {info['date']}, {mode}, "
        f"{config.rounds} round(s) per figure: each cell is the median of the rounds, with "
        "min–max; a ratio is the median of the per-round ratios against the reference "
        "measured in the same round.",
        "",
        f"- machine: {info['nproc']} CPUs, {info['cpu']}, {info['platform']}; "
        f"load average at start {load}",
        f"- versions: Python {info['python']}, pyzmq {info['pyzmq']}, libzmq {info['libzmq']}, "
        f"msgspec {info['msgspec']}, zns {info['zns']}"
        + (f" (commit {info['commit']})" if info["commit"] else ""),
        "",
    ]
    targets = [(r, f) for r in results for f in r.figures if f.target]
    if targets:
        lines += ["## Targets", "", "| benchmark | figure | value | ratio | target | met |",
                  "|---|---|---|---|---|---|"]
        for result, fig in targets:
            row = _row(fig)
            lines.append(f"| {result.name} | {row[0]} | {row[1]} | {row[4]} | {row[5]} | {row[6]} |")
        lines.append("")
    for result in results:  # unnumbered: a partial run replaces sections by their heading
        lines += [f"## {result.title}", "", result.method.strip(), ""]
        if result.error:
            lines += ["**This benchmark failed:**", "", "```", result.error.strip(), "```", ""]
        if result.figures:
            lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
            lines += ["| " + " | ".join(_row(fig)) + " |" for fig in result.figures]
            notes = [f"- {fig.name}: {fig.note}" for fig in result.figures if fig.note]
            lines += ["", *notes, ""] if notes else [""]
        lines.append(f"_{result.seconds:.0f} s._\n")
    # The soak runs for 10 minutes, apart from `make bench`; its latest results belong here too.
    soak = BENCH_DIR / "soak-results.md"
    if soak.exists():
        lines += [soak.read_text().strip(), ""]
    return "\n".join(lines)


def as_json(results: Sequence[BenchResult], info: dict[str, Any], config: RunConfig) -> str:
    doc = {
        "machine": info, "quick": config.quick, "rounds": config.rounds,
        "benchmarks": {
            r.name: {"title": r.title, "error": r.error or None, "seconds": r.seconds,
                     "figures": [f.as_json() for f in r.figures]}
            for r in results
        },
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


# --- a partial run merged into the published results ------------------------------


def _sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A results.md as its preamble and its `## ` sections, (heading line, whole text)."""
    preamble, sections = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append([line.rstrip("\n"), line])
        elif sections:
            sections[-1][1] += line
        else:
            preamble.append(line)
    return "".join(preamble), [(h, body) for h, body in sections]


def merge_markdown(old: str, results: Sequence[BenchResult], info: dict[str, Any],
                   config: RunConfig) -> str:
    """`old` with the sections and Targets rows of `results` replaced (or added before the
    soak), and a preamble line saying when and how these were rerun; the rest is kept."""
    ran = {r.name for r in results}
    old_pre, old_secs = _sections(old)
    _, new_secs = _sections(markdown(results, info, config))
    new_by_heading = dict(new_secs)
    mode = "quick (smoke) parameters" if config.quick else "full parameters"
    load = ", ".join(f"{x:.2f}" for x in info["load_average"])
    pre_lines = [line for line in old_pre.rstrip("\n").splitlines()
                 if not any(line.startswith(f"- `{name}` rerun") for name in ran)]
    for result in results:
        pre_lines.append(
            f"- `{result.name}` rerun alone on {info['date']}, {mode}, {config.rounds} round(s)"
            + (f", commit {info['commit']}" if info["commit"] else "")
            + f"; load average at start {load}")
    out = ["\n".join(pre_lines) + "\n\n"]
    placed: set[str] = set()
    for heading, body in old_secs:
        if heading == "## Targets":
            rows = [line for line in body.splitlines()
                    if not (line.startswith("| ") and line.split(" | ")[0][2:] in ran)]
            new_rows = [line for line in new_by_heading.get(heading, "").splitlines()
                        if line.startswith("| ") and line.split(" | ")[0][2:] in ran]
            while rows and not rows[-1].strip():
                rows.pop()
            out.append("\n".join(rows + new_rows) + "\n\n")
            placed.add(heading)
        elif heading == "## Soak":  # last, as `markdown` puts it; new sections go before it
            out += [b for h, b in new_secs if h not in placed and h != "## Soak"]
            placed.update(h for h, _ in new_secs)
            out.append(new_by_heading.get(heading, body))
        elif heading in new_by_heading:
            out.append(new_by_heading[heading])
            placed.add(heading)
        else:
            out.append(body)
    out += [b for h, b in new_secs if h not in placed and h != "## Soak"]
    return "".join(out)


def merge_json(old: str, results: Sequence[BenchResult], info: dict[str, Any],
               config: RunConfig) -> str:
    """`old` with the entries of `results` replaced or added; each carries its own run's
    machine, mode and rounds (the top-level ones describe the last full run)."""
    doc = json.loads(old)
    new = json.loads(as_json(results, info, config))["benchmarks"]
    for name, entry in new.items():
        entry.update(machine=info, quick=config.quick, rounds=config.rounds)
        doc.setdefault("benchmarks", {})[name] = entry
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _kept(path: Path, ran: set[str]) -> list[str]:
    """Benchmarks already in `path` (results.json) that this run did not measure."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [name for name in doc.get("benchmarks", {}) if name not in ran]


# --- the shared command line -------------------------------------------------


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def cli(benches: dict[str, BenchFn], argv: Sequence[str] | None = None,
        default_out: Path | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run zns benchmarks.")
    parser.add_argument("only", nargs="*", metavar="NAME",
                        help=f"run only these (of {', '.join(benches)})")
    parser.add_argument("--quick", action="store_true",
                        help="tiny parameters and one round: a smoke run, not a measurement")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 3; 1 with --quick)")
    parser.add_argument("--out", type=Path,
                        help="write results.md and results.json into this directory"
                        + (f" (default {default_out}, not for --quick)" if default_out else ""))
    args = parser.parse_args(argv)
    if args.out is None and not args.quick:
        args.out = default_out  # a smoke run never overwrites the published results
    unknown = set(args.only) - benches.keys()
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    rounds = args.rounds or (1 if args.quick else 3)
    info = machine()
    results = []
    # SIGTERM (a timeout, `kill`) ends the run as Ctrl-C does: every `with` below unwinds,
    # so the servers stop and the folder goes, instead of the process dying around them.
    signal.signal(signal.SIGTERM, _terminated)
    with tempfile.TemporaryDirectory(prefix="zns-bench-") as tmp:
        config = RunConfig(quick=args.quick, rounds=rounds, workdir=Path(tmp))
        for name in args.only or benches:
            print(f"== {name}", file=sys.stderr, flush=True)
            started = time.monotonic()
            try:
                result = benches[name](config)
            except Exception:
                result = BenchResult(name, name, "", error=traceback.format_exc())
                print(result.error, file=sys.stderr)
            result.seconds = time.monotonic() - started
            results.append(result)
    print(text_table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        md, js = args.out / "results.md", args.out / "results.json"
        kept = _kept(js, {r.name for r in results})
        if kept:  # a partial run: the other benchmarks' published results stay
            md.write_text(merge_markdown(md.read_text(), results, info, config))
            js.write_text(merge_json(js.read_text(), results, info, config) + "\n")
            print(f"kept the results of {', '.join(kept)}", file=sys.stderr)
        else:
            md.write_text(markdown(results, info, config))
            js.write_text(as_json(results, info, config) + "\n")
        print(f"wrote {args.out / 'results.md'} and {args.out / 'results.json'}")
    return 1 if any(r.error for r in results) else 0
