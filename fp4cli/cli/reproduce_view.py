"""What `fp4 reproduce` prints: the list of studies, a study's runs, and a table per claim with
its test and verdict (the numbers come from fp4cli.analysis.reproduce)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp4cli.analysis.stats import ALPHA, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

VERDICT_STYLE = {REPRODUCED: "bold green", NOT_REPRODUCED: "bold red", INCONCLUSIVE: "yellow",
                 "holds": "green", "fails": "red", "open": "yellow"}  # fmt: skip
TEST = (
    f"each claim's per-seed contrast (positive where it holds) by a paired one-sided t-test at "
    f"alpha = {ALPHA} each way, shown as its {100 * (1 - 2 * ALPHA):.0f}% confidence interval: "
    f"reproduced when the interval lies above 0, not reproduced when below, inconclusive when it "
    f"holds 0 (the seeds' spread is wider than the effect) or on fewer than 2 seeds; a claim of "
    f"several tests needs all of them (and fails on any one at alpha / k)"
)


def print_list(studies: Sequence[Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fp4cli.analysis.study import Overrides, study_spec
    from fp4cli.cli.output import console_for
    from fp4cli.sweep import expand_points

    table = Table(
        "study",
        "task",
        "size",
        "steps",
        "seeds",
        "runs",
        "claims",
        "paper",
        box=None,
        pad_edge=False,
        title="fp4 reproduce NAME",
    )
    for study in studies:
        spec = study_spec(study, Overrides())
        train = dict(spec.train)
        table.add_row(
            study.name,
            spec.tasks[0],
            str(train.get("size", "default")),
            str(train.get("steps", "task default")),
            str(len(spec.seeds)),
            str(len(expand_points(spec))),
            str(len(study.claims)),
            escape(study.paper.citation or study.description),
        )
    console = console_for(table)
    console.print(table)


def plan_line(plan: Any) -> str:
    done, pending = len(plan.done), len(plan.pending)
    busy = f", {len(plan.elsewhere)} running in another process" if plan.elsewhere else ""
    return (
        f"Study sweep {plan.spec.name}: {len(plan.points)} runs, {done} done, {pending} to "
        f"run{busy}."
    )


def print_plan(study: Any, plan: Any) -> None:
    """The dry run: every run (point, seed, arm, state) and the claims it will judge."""
    from rich.markup import escape

    from fp4cli.analysis.reproduce import arm_name
    from fp4cli.cli.output import console_for
    from fp4cli.cli.sweep_cmd import points_table

    table = points_table(plan, "arm", arm_name)
    console = console_for(table)
    console.print(table)
    console.print(plan_line(plan))
    for claim in study.claims:
        console.print(f"claim {claim.number} ({claim.kind}): {escape(claim.statement)}")


def print_results(
    study: Any, spec: Any, plan: Any, results: Sequence[Any], store: Path, written: list[Path]
) -> None:
    from rich.console import Group
    from rich.markup import escape

    from fp4cli.cli.output import console_for

    blocks = [_claim_block(result) for result in results]
    console = console_for(*[b for block in blocks for b in block])
    console.print(f"[bold]Study {study.name}[/]: {escape(study.description)}")
    if study.paper.citation:
        console.print(f"Paper: {escape(study.paper.citation)}")
    console.print(
        f"Runs: {_setting(spec)}; sweep {spec.name} in {store} (fp4 report --sweep {spec.name})"
    )
    console.print(f"[dim]Verdicts: {TEST}.[/]")
    for block in blocks:
        console.print()
        console.print(Group(*block))
    console.print()
    console.print(_summary(results))
    for path in written:
        console.print(f"[dim]wrote {path}[/]")


def to_json(
    study: Any, spec: Any, plan: Any, results: Sequence[Any], store: Path
) -> dict[str, Any]:
    return {
        "study": study.name,
        "sweep": spec.name,
        "sweep_id": plan.sweep_id,
        "store": str(store),
        "task": spec.tasks[0],
        "train": dict(spec.train),
        "seeds": list(spec.seeds),
        "runs": {"total": len(plan.points), "done": len(plan.done)},
        "paper": {"citation": study.paper.citation, "setting": study.paper.setting},
        "test": TEST,
        "alpha": ALPHA,
        "claims": [result.to_dict() for result in results],
    }


def _setting(spec: Any) -> str:
    train = dict(spec.train)
    seeds = ", ".join(map(str, spec.seeds))
    steps = train.get("steps", "the task's default")
    data = f", data {train['data']}" if train.get("data") else ""
    return f"{spec.tasks[0]} ({train.get('size', 'default')}), {steps} steps, seeds {seeds}{data}"


def _claim_block(result: Any) -> list[Any]:
    from rich.markup import escape

    claim = result.claim
    title = f"Claim {claim.number} ({claim.kind}): {escape(claim.statement)}"
    block: list[Any] = [f"[bold]{title}[/]", _arm_table(result)]
    headline = _headline(result)
    if headline:
        block.append(headline)
    if len(result.comparisons) == 1:
        block.append(_test_line(result.comparisons[0]))
    elif result.comparisons:
        block.append(_comparison_table(result))
    if claim.paper.note:
        block.append(f"[dim]paper: {escape(claim.paper.note)}[/]")
    block += [f"[dim]note: {escape(note)}[/]" for note in result.notes]
    block.append(f"verdict: {_verdict(result.verdict)}")
    return block


def _arm_table(result: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    claim, metric = result.claim, result.metric
    table = Table(box=None, pad_edge=False)
    table.add_column("arm", overflow="fold")
    table.add_column("seeds", justify="right")
    table.add_column(f"{metric}, mean ± std", justify="right")
    with_gap = any(line.gap is not None for line in result.lines)
    if with_gap:
        table.add_column("gap to bf16", justify="right")
    if claim.kind == "pareto":
        table.add_column("cost", justify="right")
    paper = claim.paper
    with_paper = any(line.paper is not None for line in result.lines)
    if with_paper:
        table.add_column(
            f"paper: {escape(paper.setting or paper.metric)}", justify="right", overflow="fold"
        )
    for line in result.lines:
        cells = [escape(line.arm), str(line.seeds), _mean_std(line.value, metric)]
        if with_gap:
            cells.append(_mean_std(line.gap, metric, signed=True) if line.gap else "-")
        if claim.kind == "pareto":
            cells.append(f"{line.cost:.2f}x" if line.cost is not None else "-")
        if with_paper:
            cells.append("-" if line.paper is None else f"{line.paper:g}")
        table.add_row(*cells)
    return table


def _headline(result: Any) -> str | None:
    from rich.markup import escape

    claim, observed, paper = result.claim, result.observed, result.paper_value
    if claim.kind == "closes":
        seen = _percent_ms(observed) if observed else "-"
        beside = f" (paper: {paper:.0%})" if paper is not None else ""
        return (
            f"closed share of {escape(claim.other)}'s gap: {seen}{beside}; the claim needs "
            f"at least {float(claim.share):.0%}"
        )
    if claim.kind in ("better", "lower", "higher") and observed:
        what = "gap" if claim.kind == "better" else claim.metric
        beside = f" (paper: {paper:+g} {claim.paper.metric})" if paper is not None else ""
        diff = _mean_std(observed, result.metric, signed=True)
        return f"{what}({escape(claim.arm)}) - {what}({escape(claim.other)}): {diff}{beside}"
    if claim.kind == "within" and observed:
        diff = _mean_std(observed, result.metric, signed=True)
        return (
            f"gap({escape(claim.arm)}) - gap({escape(claim.other)}): {diff}; the claim allows "
            f"at most {claim.margin:g}"
        )
    if claim.kind == "pareto" and observed:
        on = "yes" if observed[0] == 1.0 else "no"
        return f"{escape(claim.arm)} on the Pareto front of the arms' mean gap and cost: {on}"
    return None


def _test_line(comparison: Any) -> str:
    from rich.markup import escape

    test = comparison.test
    if test.n < 2:
        return f"test: {escape(comparison.label)} on {test.n} seed(s): a verdict needs at least 2"
    return (
        f"test: paired t-test of {escape(comparison.label)} over {test.n} seeds: mean "
        f"{test.mean:+.4g}, {_ci(test)}, t = {test.t:.2f}, df = {test.df}, one-sided "
        f"p = {test.p_holds:.3g}"
    )


def _comparison_table(result: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, title_justify="left")
    for name, justify in (
        ("paired test of", "left"),
        ("seeds", "right"),
        ("mean", "right"),
        ("90% CI", "right"),
        ("p (holds)", "right"),
        ("test", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for comparison in result.comparisons:
        test = comparison.test
        enough = test.n >= 2
        interval = _ci(test, bare=True) if enough else "-"
        p_value = f"{test.p_holds:.3g}" if enough else "-"
        cells = (f"{test.mean:+.4g}", interval, p_value, _verdict(comparison.verdict))
        table.add_row(escape(comparison.label), str(test.n), *cells)
    k = len(result.comparisons)
    table.caption = (
        f"holds: p < {ALPHA}; fails: the other way at p < {ALPHA} / {k}; open: neither. The "
        "claim is reproduced when every test holds, not reproduced when one fails"
    )
    table.caption_justify = "left"
    return table


def _summary(results: Sequence[Any]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        "#", "verdict", "claim", box=None, pad_edge=False, title="Verdicts", title_justify="left"
    )
    for result in results:
        table.add_row(
            str(result.claim.number), _verdict(result.verdict), escape(result.claim.statement)
        )
    return table


def _verdict(verdict: str) -> str:
    return f"[{VERDICT_STYLE[verdict]}]{verdict}[/]"


def _ci(test: Any, bare: bool = False) -> str:
    interval = f"[{test.low:+.4g}, {test.high:+.4g}]"
    return interval if bare else f"{100 * (1 - 2 * ALPHA):.0f}% CI {interval}"


def _mean_std(pair: Any, metric: str, signed: bool = False) -> str:
    mean, std = pair
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    text = _number(mean, metric, signed)
    return text if std is None or math.isnan(std) else f"{text} ± {_number(std, metric)}"


def _number(value: float, metric: str, signed: bool = False) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if metric == "top1":
        spec = ".2f"
    elif metric.endswith("loss"):
        spec = ".4f"
    else:
        spec = ".4g"
    return f"{value:{'+' if signed else ''}{spec}}"


def _percent_ms(pair: Any) -> str:
    mean, std = pair
    return f"{mean:.0%}" if math.isnan(std) else f"{mean:.0%} ± {std:.0%}"
