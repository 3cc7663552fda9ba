"""torch.compile's activation memory budget against edgetrain's plans, per model, at equal memory.

PyTorch's own answer for any traced model is the min-cut rematerialisation of AOTAutograd's
partitioner, steered by ``torch._functorch.config.activation_memory_budget`` (1.0: save what the
default partitioner saves; lower: recompute more). edgetrain plans checkpointing on a chain of
stages. Each setting (:mod:`edgetrain.runtime.step_settings` builds its step) runs in its own child process (one
torch thread, glibc's mmap threshold pinned as under a process budget so that freed memory leaves the process and
RSS follows the live memory): a few warm-up steps (compilation for inductor), then ``STEPS`` timed steps, each
ending with ``zero_grad(set_to_none=True)``, then one more step under ``torch.profiler`` with
``profile_memory``. Reported per setting, as the median over ``ROUNDS`` rounds in which the
settings alternate:

* ``step_tensor_peak_mib``: the most bytes the step held in tensors *above* what lived between
  steps, from the c10 allocator's own allocation records (the profiler's ``[memory]`` events):
  an instrument that sees inside inductor's compiled code as well as eager, not edgetrain's
  tracker;
* ``step_peak_mib``: the peak RSS of the timed steps above the RSS between steps (VmHWM reset
  after warm-up): the process's view of the same step; ``rest_rss_mib`` beside it is what the
  process holds between steps (compiled code and inductor's caches included);
* ``step_time_ratio`` and ``step_cpu_time_ratio``: median step time over eager plain training's in
  the same round, by the wall clock and by the stepping thread's CPU time (one torch thread, so
  the two agree on an idle machine; on a shared one the CPU clock leaves out the time other
  processes took the core). Each child also records, per timed step, the stepping thread's minor
  page faults (the kernel's work zeroing fresh pages, which the CPU clock counts: with the mmap
  threshold pinned every large tensor is a fresh mapping), its involuntary context switches
  (``step_preemptions``: another process took the core, time the wall clock counts and the CPU clock
  does not), and the CPU time the process's other threads took during a step (``other_threads_cpu_s``,
  the most of any step: work the thread's clock would miss) and ``dynamo_events_in_timed_steps`` (a
  recompilation would count there).

Settings: ``eager``; ``inductor:B`` compiles with ``activation_memory_budget = B``;
``edgetrain:least`` trains under ``Checkpointed`` at the least feasible budget; ``edgetrain=inductor:B`` at the
budget whose *step* share (budget minus the weights, optimizer state and batch the chain holds anyway) is the
tensor step peak that ``inductor:B`` measured in the same round, so the two meet at one memory level;
``edgetrain+compile=inductor:B`` the same with every stage compiled by inductor before it is profiled and planned
(``Checkpointed(compile_stages=True)``, NOTE [ Compiled stages ]); ``edgetrain+compiled=inductor:B`` is
:func:`edgetrain.runtime.compiled.fit_compiled` at the same matched budget: the fastest whose step fits of
inductor's own graph at 1.0, 0.5 and 0.0 and edgetrain's regions in one graph compiled at 1.0 (NOTE [ A byte budget
for torch.compile ]). ``+step_in_backward`` after a setting's kind runs it with the optimizer stepped in the
backward, one SGD per parameter hooked to its gradient's accumulation (NOTE [ The optimizer step in the backward ]
in ``chain.py``): a step with another contract (no gradient outlives the backward).

The verdicts: per inductor level, edgetrain's fastest setting whose tensor step peak is not above it, by the CPU
clock; and whether edgetrain's least-memory step goes below the least any inductor budget reached. A setting with
``+step_in_backward`` is judged only against inductor's rows of the same contract. Where ``fit_compiled``
takes inductor's own graph at the level's budget, the verdict calls it the same graph, a tie. Inductor needs a C
compiler.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgetrain.bench.stats import spread
from edgetrain.models.cases import block_model_cases, model_cases
from edgetrain.runtime.step_settings import IN_BACKWARD, REGISTRY_MODELS, in_backward, setting_step

TITLE = "torch.compile's memory budget against edgetrain, model by model"

LEVELS = ("1.0", "0.5", "0.0")   # inductor's activation_memory_budget at each level edgetrain is matched to
SETTINGS = ("eager", *(f"inductor:{b}" for b in LEVELS), "edgetrain:least",
            *(f"edgetrain=inductor:{b}" for b in LEVELS), *(f"edgetrain+compile=inductor:{b}" for b in LEVELS),
            *(f"edgetrain+compiled=inductor:{b}" for b in LEVELS),
            "inductor+step_in_backward:1.0", "edgetrain+step_in_backward:least")
BATCH, IMAGE = 8, 128   # resnet18's and mobilenet_v2's; the other models have their cases' inputs
STEPS, ROUNDS = 5, 2
# The quick run: the user's Sequential CNN (a compile of seconds), at two of inductor's levels, edgetrain's own
# plans and fit_compiled matched to them, two rounds of three timed steps.
QUICK_MODELS = ("user_sequential_cnn",)
QUICK_SETTINGS = ("eager", "inductor:1.0", "inductor:0.0", "edgetrain:least", "edgetrain=inductor:1.0",
                  "edgetrain=inductor:0.0", "edgetrain+compiled=inductor:1.0")
QUICK_STEPS, QUICK_ROUNDS = 3, 2
MATCH = "=inductor:"
FLOOR_TIE = 0.005   # a least peak this close to inductor's floor (either way) is the same working set: a tie
MiB = 2**20
ROOT = Path(__file__).resolve().parent.parent
# the recorded full runs beside the quick run's results file; docs/results/compile_budget_full.md reads them
KEPT_FILES = {
    "compile_budget/compile_budget.json": "every recorded full run over twelve models: each setting's tensor and RSS "
                                          "peaks, CPU and wall ratios, per round (page: compile_budget_full.md)",
    "compile_budget/scratch_resnet18.json": "ResNet-18's whole-step verdicts with the kernels' scratch planned",
    "compile_budget/scratch_models.json": "MobileNetV2, MobileNetV3-Small, U-Net, EfficientNet-B0: edgetrain's steps "
                                          "by the allocator's records, scratch planned",
    "compile_budget/between_steps.json": "the same four models, step shares taken above what lives between steps",
    "compile_budget/least_long_chain.json": "EfficientNet-B0's least plan on its 79-stage chain",
    "compile_budget/rng_states.json": "four dropout models' least steps, with the generator states planned",
}
CHILD = "import sys; from benchmarks.compile_budget import child; child(*sys.argv[1:])"


def all_models() -> list[str]:
    """The zoo's two, then the cases of :mod:`edgetrain.models.cases`; the weight-bound ``unet`` and ``gpt2`` inputs
    are left to their activation-bound twins ``unet_w16`` and ``gpt_4x256`` (no recomputation helps a weight-bound
    step)."""
    names = dict.fromkeys([*block_model_cases(), *model_cases()])
    return [*REGISTRY_MODELS, *(name for name in names if name not in ("unet", "gpt2"))]


def thread_counts(usage: Any = None) -> tuple[int, int]:
    """The stepping thread's minor page faults and involuntary context switches (another process took its
    core) so far, or in ``usage``: the first is step work the CPU clock counts (the kernel zeroing fresh
    pages), the second is time the wall clock counts and the CPU clock does not."""
    usage = usage or resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt, usage.ru_nivcsw


def dynamo_event_count() -> int:
    """Everything torch._dynamo has counted so far (frames traced, graphs captured, recompilations): unchanged over
    the timed steps when no step traced or compiled anything again."""
    from torch._dynamo.utils import counters
    return sum(sum(counter.values()) for counter in counters.values())


def child(setting: str, name: str, batch: str, image: str, steps: str, match_step_bytes: str) -> None:
    """One setting in this process (its arguments as the parent passes them on the command line): print its JSON
    line (the parent reads the last line)."""
    from edgetrain.profiling.process import configure_allocator, read_process_memory, reset_peak, return_freed_memory
    from edgetrain.runtime.compiled import measured_step_peak_bytes
    configure_allocator()
    step, info = setting_step(setting, name, int(batch), int(image),
                              int(match_step_bytes) if match_step_bytes else None)
    for _ in range(3):
        step()
    return_freed_memory()   # every setting's timed steps start from a trimmed heap: a search of several compiled
    # candidates (edgetrain+compiled) left free heap that spared its steps page faults (YOLOv8n: inductor 0.5's own
    # graph at 0.66x after the search against 0.83x in its own process, 6.9 against 28.3 thousand faults a step)
    rest = read_process_memory().rss_bytes
    reset_peak()
    dynamo_events = dynamo_event_count()
    times, cpu_times, process_cpu_times, usages = [], [], [], []
    for _ in range(int(steps)):
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        start, start_cpu, start_process = time.perf_counter(), time.thread_time(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - start_cpu)
        process_cpu_times.append(time.process_time() - start_process)
        usages.append([after - before for after, before in zip(thread_counts(), thread_counts(usage), strict=True)])
    step_peak = read_process_memory().peak_rss_bytes - rest
    dynamo_events = dynamo_event_count() - dynamo_events
    faults, switches = (statistics.median(column) for column in zip(*usages, strict=True))
    print(json.dumps({"median_step_s": statistics.median(times), "median_step_cpu_s": statistics.median(cpu_times),
                      "step_cpu_s": cpu_times,
                      "other_threads_cpu_s": max(p - c for p, c in zip(process_cpu_times, cpu_times, strict=True)),
                      "step_minor_faults": faults, "step_preemptions": switches,
                      "dynamo_events_in_timed_steps": dynamo_events,
                      "step_peak_bytes": step_peak, "rest_rss_bytes": rest,
                      "step_tensor_peak_bytes": measured_step_peak_bytes(step), **info}))


def _run_child(setting: str, name: str, steps: int, match_step_bytes: int | None) -> dict[str, Any]:
    command = [sys.executable, "-c", CHILD, setting, name, str(BATCH), str(IMAGE), str(steps),
               "" if match_step_bytes is None else str(match_step_bytes)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode != 0:   # an infeasible budget or a model inductor cannot compile: say which, go on
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _run_round(name: str, settings: tuple[str, ...], steps: int) -> dict[str, dict[str, Any]]:
    """Every setting once; the matched ones after the inductor runs they match."""
    results: dict[str, dict[str, Any]] = {}
    for setting in sorted(settings, key=lambda s: MATCH in s):
        match = None
        if MATCH in setting:
            target = results.get("inductor:" + setting.split(MATCH)[1], {})
            if "step_tensor_peak_bytes" not in target:
                results[setting] = {"error": "its inductor setting did not run"}
                continue
            match = int(target["step_tensor_peak_bytes"])
        results[setting] = _run_child(setting, name, steps, match)
    return results


def run(quick: bool) -> dict[str, Any]:
    """Every model's settings over the rounds (the settings alternating within a round), summarised per setting."""
    models = QUICK_MODELS if quick else tuple(all_models())
    settings = QUICK_SETTINGS if quick else SETTINGS
    steps, rounds = (QUICK_STEPS, QUICK_ROUNDS) if quick else (STEPS, ROUNDS)
    rows: list[dict[str, Any]] = []
    for name in models:
        measured = []
        for number in range(rounds):
            measured.append(_run_round(name, settings, steps))
            print(f"{name}: round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
        rows += summarise(name, settings, measured)
    return {"models": list(models), "settings": list(settings), "batch": BATCH, "image": IMAGE, "steps": steps,
            "rounds": rounds, "rows": rows, "verdicts": verdicts(rows)}


def summarise(name: str, settings: Sequence[str], rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per setting over the rounds where it and eager ran: medians, ranges and the spread of the ratios to
    eager (each round's ratio to its own eager run), the peaks, and what its plan predicted."""
    rows = []
    for setting in settings:
        ok = [r for r in rounds if "error" not in r[setting] and "error" not in r["eager"]]
        if not ok:
            rows.append({"model": name, "setting": setting, "error": rounds[-1][setting].get("error")})
            continue
        row: dict[str, Any] = {"model": name, "setting": setting, "rounds": len(ok)}
        for clock in ("", "_cpu"):
            ratios = [r[setting][f"median_step{clock}_s"] / r["eager"][f"median_step{clock}_s"] for r in ok]
            row[f"step{clock}_time_ratio"] = statistics.median(ratios)
            row[f"step{clock}_time_ratio_range"] = [min(ratios), max(ratios)]
            row[f"step{clock}_time_ratio_spread"] = spread(ratios).to_dict()
            row[f"eager_step{clock}_s"] = statistics.median(r["eager"][f"median_step{clock}_s"] for r in ok)
        cpu_steps = [t for r in ok for t in r[setting].get("step_cpu_s", [])]
        if len(cpu_steps) > 1:   # the timed steps of every round: how steady one setting's step was
            row["step_cpu_cov_pct"] = 100 * statistics.stdev(cpu_steps) / statistics.mean(cpu_steps)
        for key in ("step_tensor_peak_bytes", "step_peak_bytes", "rest_rss_bytes"):
            values = [r[setting][key] / MiB for r in ok]
            row[key.replace("_bytes", "_mib")] = statistics.median(values)
            row[key.replace("_bytes", "_mib_range")] = [min(values), max(values)]
        for key in ("step_minor_faults", "step_preemptions"):
            row[key] = statistics.median(r[setting][key] for r in ok)
        for key in ("other_threads_cpu_s", "dynamo_events_in_timed_steps"):   # the most of any round
            row[key] = max(r[setting][key] for r in ok)
        for key in ("single_level_kinds", "candidates", "partitioner_budget"):   # a regions row's plan may differ
            # between rounds
            if all(key in r[setting] for r in ok):
                row[f"{key}_by_round"] = [r[setting][key] for r in ok]
        for key in ("predicted_step_peak_bytes", "recompute_factor", "budget_bytes", "least_bytes",
                    "fit_step_peaks_bytes", "single_level_kinds", "partitioner_budget", "gradients_bytes"):
            if key in ok[-1][setting]:
                row[key] = ok[-1][setting][key]
        rows.append(row)
    return rows


def whole_graph(row: dict[str, Any]) -> bool:
    """Whether ``row`` compiled the whole model as one graph (``edgetrain+regions`` or ``edgetrain+compiled``)."""
    return "+regions" in row["setting"] or "+compiled" in row["setting"]


def configuration(row: dict[str, Any]) -> str:
    """What a whole-graph row ran: the partitioner's budget ``b`` and edgetrain's regions (``S`` opens one, ``R``
    continues it, ``.`` kept), or, where the plan keeps every stage, inductor's own graph at ``b``; round by
    round where the rounds' fits picked different plans (a row that keeps no ``b`` per round names the last
    round's ``b``)."""
    if not whole_graph(row):
        return row["setting"]
    last = row.get("partitioner_budget", 1.0)   # a row whose setting names no b ran at 1.0
    plans = row.get("single_level_kinds_by_round", [row.get("single_level_kinds", "")])
    budgets = row.get("partitioner_budget_by_round", [last] * len(plans))
    named = list(dict.fromkeys(
        f"b={b}, " + (f"regions {kinds}" if "S" in kinds else f"no regions (inductor:{b}'s graph)")
        for kinds, b in zip(plans, budgets, strict=True)))
    return named[0] if len(named) == 1 else "by round: " + "; ".join(named)


def inductor_graph(row: dict[str, Any]) -> bool:
    """Whether ``row`` ran inductor's own graph (a whole-graph row without a region) in every round."""
    plans = row.get("single_level_kinds_by_round", [row.get("single_level_kinds", "S")])
    return whole_graph(row) and not any("S" in kinds for kinds in plans)


def same_graph(row: dict[str, Any], level: dict[str, Any]) -> bool:
    """Whether ``row`` ran the very graph of inductor ``level`` in every round: inductor's own graph at its budget."""
    budgets = row.get("partitioner_budget_by_round", [row.get("partitioner_budget", 1.0)])
    return inductor_graph(row) and all(f"inductor:{b}" == level["setting"] for b in budgets)


def verdicts(rows: list[dict[str, Any]], with_regions: bool = True) -> list[dict[str, Any]]:
    """Per model and inductor level: edgetrain's fastest setting whose tensor step peak is not above it.

    Time by the CPU clock, each ratio to eager in its own round. ``below_floor``: edgetrain's least-memory step
    more than ``FLOOR_TIE`` under the least tensor peak any inductor setting reached (``at_floor``: within it either
    way). ``with_regions=False`` leaves the whole-graph rows (``edgetrain+regions``, ``edgetrain+compiled``) out:
    edgetrain's own plans, eager or per-stage compiled, alone. ``same_graph``: the fastest is inductor's own graph
    at that level (no regions, the same budget), a tie by construction whatever the clocks say. Rows with the
    optimizer in the backward (``IN_BACKWARD``) are judged against inductor's rows of that contract only, and the
    others against the others: the floor row of the first is named ``floor+step_in_backward``.
    """
    out = []
    def group(row: dict[str, Any]) -> tuple[str, bool]:   # the rows of one model and one contract
        return row["model"], in_backward(row["setting"])

    for name, contract in dict.fromkeys(group(row) for row in rows):
        ran = [row for row in rows if group(row) == (name, contract) and "error" not in row]
        inductor = [row for row in ran if row["setting"].startswith("inductor")]
        ours = [row for row in ran if row["setting"].startswith("edgetrain")
                and (with_regions or not whole_graph(row))]
        if not ours:   # yardsticks and whole-graph rows only, without them
            continue
        for level in inductor:
            fitting = [row for row in ours if row["step_tensor_peak_mib"] <= level["step_tensor_peak_mib"]]
            best = min(fitting, key=lambda row: row["step_cpu_time_ratio"], default=None)
            out.append({"model": name, "inductor": level["setting"],
                        "inductor_mib": level["step_tensor_peak_mib"],
                        "inductor_cpu_ratio": level["step_cpu_time_ratio"],
                        "edgetrain": best and configuration(best),
                        "edgetrain_mib": best and best["step_tensor_peak_mib"],
                        "edgetrain_cpu_ratio": best and best["step_cpu_time_ratio"],
                        "same_graph": best is not None and same_graph(best, level),
                        "inductor_graph": best is not None and inductor_graph(best),
                        "no_slower": best is not None and best["step_cpu_time_ratio"] <= level["step_cpu_time_ratio"]})
        least = min((row for row in ours if row["setting"].endswith(":least") or whole_graph(row)),
                    key=lambda row: row["step_tensor_peak_mib"], default=None)
        if inductor and least:
            floor = min(row["step_tensor_peak_mib"] for row in inductor)
            out.append({"model": name, "inductor": "floor" + (IN_BACKWARD if contract else ""),
                        "inductor_mib": floor,
                        "edgetrain": configuration(least),
                        "edgetrain_mib": least["step_tensor_peak_mib"],
                        "edgetrain_cpu_ratio": least["step_cpu_time_ratio"],
                        "below_floor": least["step_tensor_peak_mib"] < floor * (1 - FLOOR_TIE),
                        "at_floor": abs(least["step_tensor_peak_mib"] - floor) <= floor * FLOOR_TIE})
    return out


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _median_range(row: dict[str, Any], key: str, digits: int) -> str:
    """The median over rounds, with the least and most of them where the rounds differ."""
    low, high = row.get(f"{key}_range", (row[key], row[key]))
    text = f"{row[key]:.{digits}f}"
    return text if f"{low:.{digits}f}" == f"{high:.{digits}f}" else f"{text} ({low:.{digits}f}-{high:.{digits}f})"


def _level_verdict(v: dict[str, Any]) -> str:
    if v["inductor"].startswith("floor"):
        return ("trains below inductor's floor" if v["below_floor"] else
                f"at inductor's floor (within {FLOOR_TIE:.1%}: a tie)" if v.get("at_floor") else
                "does not reach inductor's floor")
    if v["same_graph"]:
        return "the same graph (a tie)"
    verdict = ("no slower" if v["no_slower"] else "slower") if v["edgetrain"] else "cannot get this low"
    if v.get("inductor_graph"):   # edgetrain+compiled took another budget's graph
        verdict += ": inductor's own graph at another budget"
    return verdict


def verdict_table(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`verdicts` as markdown lines."""
    lines = ["| model | inductor level | its tensor MiB | its CPU / eager | edgetrain at or below it | "
             "tensor MiB | CPU / eager | verdict |", "|---|---|---|---|---|---|---|---|"]
    for v in rows:
        if v["inductor"].startswith("floor"):
            level = "least of any budget" + (f" ({IN_BACKWARD[1:]})" if v["inductor"] != "floor" else "")
            lines.append(f"| {v['model']} | {level} | {mib(v['inductor_mib'])} | | {v['edgetrain']} | "
                         f"{mib(v['edgetrain_mib'])} | {ratio(v['edgetrain_cpu_ratio'])} | {_level_verdict(v)} |")
            continue
        lines.append(f"| {v['model']} | {v['inductor']} | {mib(v['inductor_mib'])} | "
                     f"{ratio(v['inductor_cpu_ratio'])} | {v['edgetrain'] or '-'} | {mib(v['edgetrain_mib'])} | "
                     f"{ratio(v['edgetrain_cpu_ratio'])} | {_level_verdict(v)} |")
    return lines


def claims(rows: list[dict[str, Any]]) -> list[str]:
    """The counts over the models of ``rows``, as markdown bullets: no slower at every level inductor reached, below
    its floor with a whole step, and below its floor with the optimizer stepped in the backward."""
    judged = [v for v in verdicts(rows) if not in_backward(v["inductor"])]
    models = list(dict.fromkeys(v["model"] for v in judged))
    levels = {m: [v for v in judged if v["model"] == m and not v["inductor"].startswith("floor")] for m in models}
    floors = {v["model"]: v for v in judged if v["inductor"] == "floor"}
    no_slower = [m for m in models if levels[m] and all(v["no_slower"] or v["same_graph"] for v in levels[m])]
    ties = sum(v["same_graph"] for m in models for v in levels[m])
    below = [m for m in models if m in floors and floors[m]["below_floor"]]
    at = [m for m in models if m in floors and floors[m]["at_floor"]]
    backward = [v for v in verdicts(rows) if v["inductor"] == "floor" + IN_BACKWARD]
    lines = [f"* At every level inductor reached, edgetrain is no slower on **{len(no_slower)} of {len(models)}** "
             f"model(s) ({ties} of the {sum(map(len, levels.values()))} levels a tie: `fit_compiled` took inductor's "
             "own graph at that level).",
             f"* Below inductor's floor (the least any of its budgets reached) edgetrain trains with a whole step on "
             f"**{len(below)} of {len(floors)}**" + (f"; at it (a tie) on {len(at)}" if at else "") + "."]
    if backward:
        lines.append(f"* With the optimizer stepped in the backward, below inductor's floor of that contract on "
                     f"**{sum(v['below_floor'] for v in backward)} of {len(backward)}**.")
    return lines


def render(result: dict[str, Any]) -> str:
    """What is measured, the counts over models, every setting's row, then the verdicts per inductor level."""
    rows = result["rows"]
    registry = [name for name in result["models"] if name.partition("@")[0] in REGISTRY_MODELS]
    inputs = (f"{', '.join(registry)} at batch {result['batch']} x {result['image']} px, the others at the inputs "
              "of `edgetrain.models.cases`") if registry else "at the inputs of `edgetrain.models.cases`"
    lines = ["PyTorch's own answer to \"train this model in less memory\" is the min-cut rematerialisation of "
             "AOTAutograd's partitioner in `torch.compile`, steered by "
             "`torch._functorch.config.activation_memory_budget` (1.0: save what the default partitioner saves; "
             "lower: recompute more; 0.0: save only the graph's inputs). This page sets edgetrain against it, model "
             "by model, **at equal memory**: at each memory level inductor reaches, is edgetrain no slower, and below "
             "inductor's least memory, does edgetrain still train? The recorded full runs over twelve models are on "
             "[their own page](compile_budget_full.md).", "",
             f"Models: {', '.join(result['models'])} ({inputs}). Each setting runs in its "
             "own child process (one torch thread, glibc's mmap threshold pinned so that freed memory leaves the "
             f"process): warm-up steps (compilation for inductor), {result['steps']} timed steps, then one step under "
             f"`torch.profiler` with `profile_memory`; the settings alternate over {result['rounds']} rounds.", "",
             "* **Memory** is judged by the c10 allocator's own records, which see inside inductor's compiled code as "
             "well as eager: the step's tensor peak above what lives between steps.",
             "* **Time** is the stepping thread's CPU time over eager plain training's in the same round (the wall "
             "clock beside it counts other processes' time on a shared machine); a figure is the median over the "
             "rounds, with the least and most in parentheses where they differ; the CoV is over every timed step.",
             "* **Settings**: `eager`; `inductor:B` compiled with `activation_memory_budget = B`; `edgetrain:least` "
             "(the least feasible budget); `edgetrain=inductor:B` planned at the tensor step peak `inductor:B` "
             "measured in the same round; `edgetrain+compile` the same with every stage compiled "
             "(`compile_stages=True`); `edgetrain+compiled` is `fit_compiled` at the matched budget (inductor's own "
             "graphs and edgetrain's regions in one compiled graph, the fastest that fits); `+step_in_backward` "
             "steps the optimizer in the backward, judged only against inductor's rows of that contract.", "",
             *claims(rows), "",
             "| model | setting | tensor step peak MiB | RSS step peak MiB | RSS between steps MiB | CPU / eager | "
             "step CPU CoV % | wall / eager | planned ρ |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['setting']} | {row['error']} | | | | | | |")
            continue
        lines.append(f"| {row['model']} | {row['setting']} | {_median_range(row, 'step_tensor_peak_mib', 1)} | "
                     f"{_median_range(row, 'step_peak_mib', 1)} | {mib(row['rest_rss_mib'])} | "
                     f"{_median_range(row, 'step_cpu_time_ratio', 2)} | {mib(row.get('step_cpu_cov_pct'))} | "
                     f"{_median_range(row, 'step_time_ratio', 2)} | {ratio(row.get('recompute_factor'))} |")
    lines += ["", "## Verdicts by edgetrain's own plans", "",
              "Eager stages, and stages compiled one by one:", "",
              *verdict_table(verdicts(rows, with_regions=False))]
    if any(whole_graph(row) for row in rows):
        lines += ["", "## Verdicts with `fit_compiled`", "",
                  "The same, with `fit_compiled`'s whole graphs among edgetrain's settings (`b`: the partitioner's "
                  "budget the graph was compiled at; regions: `S` opens one, `R` continues it, `.` kept):", "",
                  *verdict_table(verdicts(rows))]
    return "\n".join(lines)
