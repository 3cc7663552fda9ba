"""torch.compile's activation memory budget against edgetrain's plans, per model, at equal memory.

PyTorch's own answer for any traced model is the min-cut rematerialisation of AOTAutograd's
partitioner, steered by ``torch._functorch.config.activation_memory_budget`` (1.0: save what the
default partitioner saves; lower: recompute more). edgetrain plans checkpointing on a chain of
stages. Each setting runs in its own child process (one torch thread, glibc's mmap threshold
pinned as under a process budget so that freed memory leaves the process and RSS follows the
live memory): a few warm-up steps (compilation for inductor), then ``--steps`` timed steps, each
ending with ``zero_grad(set_to_none=True)``, then one more step under ``torch.profiler`` with
``profile_memory``. Reported per setting, as the median over ``--rounds`` rounds in which the
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
  recompilation would count there). Where wall and CPU ratios disagree, these
  say whether the CPU clock missed work of the step (it would show as other threads' time) or the
  step waited for the core.

Settings: ``eager``; ``inductor:B`` compiles with ``activation_memory_budget = B``;
``edgetrain:R`` trains under ``Checkpointed(recompute=R)``; ``edgetrain:least`` at the least
feasible budget; ``edgetrain=inductor:B`` at the budget whose *step* share (budget minus the
weights, optimizer state and batch the chain holds anyway) is the tensor step peak that
``inductor:B`` measured in the same round, so the two meet at one memory level;
``edgetrain+compile:R`` and ``edgetrain+compile=inductor:B`` the same with every stage compiled by
inductor before it is profiled and planned (``Checkpointed(compile_stages=True)``, NOTE [ Compiled
stages ]). edgetrain plans with measured stage times and, for the traced models without
compilation, recomputation inside coarse stages (``blocks=True``). ``edgetrain+regions@b=inductor:B``
(not among the defaults) plans one level of recomputation for the same matched budget
(``planners/single_level.py``), runs its regions in ``torch.utils.checkpoint`` and compiles the
whole model once at ``activation_memory_budget = b`` (1.0 where ``@b`` is left out), so that
inductor's min-cut decides what to save outside the regions, fuses inside them and recomputes them
in the backward (NOTE [ Checkpoint regions in one compiled graph ] in ``runtime/regions.py``); its
row names the plan (``single_level_kinds``) and ``b``. A plan that keeps every stage is inductor's
own graph at ``b``, and at ``b = B`` the verdict calls it the same graph, not a win. (``b = 0``
saves only the graph's inputs and recomputes everything, so regions change nothing there.)
``+step_in_backward`` after a setting's kind (``inductor+step_in_backward:1.0``,
``edgetrain+step_in_backward:least``; not among the defaults) runs it with the optimizer stepped in the
backward, one SGD per parameter hooked to its gradient's accumulation (``Checkpointed(step_in_backward=...)``,
NOTE [ The optimizer step in the backward ] in ``chain.py``): a step with another contract (no gradient
outlives the backward), so its rows are judged only against inductor's rows of the same contract.
``edgetrain+compiled=inductor:B`` (not among the defaults) is the library's
:func:`edgetrain.runtime.compiled.fit_compiled` at the same matched budget: the fastest whose step fits
of inductor's own graph at 1.0, 0.5 and 0.0 and the regions fitted at 1.0 (NOTE [ A byte budget for
torch.compile ]); where it takes inductor's own graph, the verdict says so (the same graph at the
level's budget is a tie; at another budget, inductor's graph, not edgetrain's plan).

    python benchmarks/compile_budget.py [--models resnet18,mobilenet_v2 --steps 4 --rounds 2]
        [--settings eager,inductor:1.0,inductor:0.5,inductor:0.0,edgetrain:least,edgetrain=inductor:1.0,...]
    python benchmarks/compile_budget.py --models all     # resnet18, mobilenet_v2 and edgetrain.models.cases' set

``resnet18`` and ``mobilenet_v2`` take ``--batch`` and ``--image`` (default 8 and 128 px); the other
names are the cases of ``edgetrain.models.cases`` (its ``block_model_cases`` inputs,
where activations rather than weights set the least budget, where it has them); ``NAME@channels_last``
runs that model with its weights and batch in channels-last memory format. Needs a C compiler for
inductor (gcc here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edgetrain.runtime.step_settings import IN_BACKWARD, REGISTRY_MODELS, in_backward, setting_step

DEFAULT_SETTINGS = ("eager,inductor:1.0,inductor:0.5,inductor:0.0,edgetrain:least,edgetrain=inductor:1.0,"
                    "edgetrain=inductor:0.5,edgetrain=inductor:0.0,edgetrain+compile=inductor:1.0,"
                    "edgetrain+compile=inductor:0.5,edgetrain+compile=inductor:0.0")
MATCH = "=inductor:"
FLOOR_TIE = 0.005   # a least peak this close to inductor's floor (either way) is the same working set: a tie
MiB = 2**20


def all_models() -> list[str]:
    """The registry's two, then edgetrain.models.cases' set; its weight-bound ``unet`` and ``gpt2`` inputs are left
    to their activation-bound twins ``unet_w16`` and ``gpt_4x256`` (no recomputation helps a weight-bound step)."""
    from edgetrain.models.cases import block_model_cases, model_cases
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


def child(setting: str, name: str, batch: int, image: int, steps: int, match_step_bytes: int | None) -> None:
    """One setting in this process: print its JSON line (the parent reads the last line)."""
    from edgetrain.profiling.process import configure_allocator, read_process_memory, reset_peak, return_freed_memory
    from edgetrain.runtime.compiled import measured_step_peak_bytes
    configure_allocator()
    step, info = setting_step(setting, name, batch, image, match_step_bytes)
    for _ in range(3):
        step()
    return_freed_memory()   # every setting's timed steps start from a trimmed heap: a search of several compiled
    # candidates (edgetrain+compiled) left free heap that spared its steps page faults (YOLOv8n: inductor 0.5's own
    # graph at 0.66x after the search against 0.83x in its own process, 6.9 against 28.3 thousand faults a step)
    rest = read_process_memory().rss_bytes
    reset_peak()
    dynamo_events = dynamo_event_count()
    times, cpu_times, process_cpu_times, usages = [], [], [], []
    for _ in range(steps):
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


def run_child(setting: str, name: str, args: argparse.Namespace, match_step_bytes: int | None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", setting, "--models", name, "--batch", str(args.batch),
               "--image", str(args.image), "--steps", str(args.steps)]
    if match_step_bytes is not None:
        command += ["--match-step-bytes", str(match_step_bytes)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:   # an infeasible budget or a model inductor cannot compile: say which, go on
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_round(name: str, settings: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
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
        results[setting] = run_child(setting, name, args, match)
    return results


def summarise(name: str, settings: list[str], rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
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
            row[f"eager_step{clock}_s"] = statistics.median(r["eager"][f"median_step{clock}_s"] for r in ok)
        cpu_steps = [t for r in ok for t in r[setting].get("step_cpu_s", [])]
        if len(cpu_steps) > 1:   # the timed steps of every round: how steady one setting's step was
            row["step_cpu_cov_pct"] = 100 * statistics.stdev(cpu_steps) / statistics.mean(cpu_steps)
        for key in ("step_tensor_peak_bytes", "step_peak_bytes", "rest_rss_bytes"):
            values = [r[setting][key] / MiB for r in ok]
            row[key.replace("_bytes", "_mib")] = statistics.median(values)
            row[key.replace("_bytes", "_mib_range")] = [min(values), max(values)]
        for key in ("step_minor_faults", "step_preemptions"):   # older runs' rows lack them
            if all(key in r[setting] for r in ok):
                row[key] = statistics.median(r[setting][key] for r in ok)
        for key in ("other_threads_cpu_s", "dynamo_events_in_timed_steps"):   # the most of any round
            if all(key in r[setting] for r in ok):
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


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'model':28s} {'setting':30s} {'tensor MiB':>10s} {'RSS MiB':>8s} {'rest MiB':>8s} {'wall/eager':>10s} "
          f"{'CPU/eager':>9s} {'CPU range':>11s}  rho(plan)")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:28s} {row['setting']:30s} -- {row['error']}")
            continue
        low, high = row["step_cpu_time_ratio_range"]
        rho = f"{row['recompute_factor']:.3f}" if "recompute_factor" in row else ""
        print(f"{row['model']:28s} {row['setting']:30s} {row['step_tensor_peak_mib']:10.1f} "
              f"{row['step_peak_mib']:8.1f} {row['rest_rss_mib']:8.1f} {row['step_time_ratio']:10.2f} "
              f"{row['step_cpu_time_ratio']:9.2f} {low:5.2f}-{high:4.2f}  {rho}", flush=True)


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

    Rows are compared only with rows of the same run (of a merged result): each ratio is to eager in its own
    round, and runs differ in load. Time by the CPU clock. ``below_floor``: edgetrain's
    least-memory step more than ``FLOOR_TIE`` under the least tensor peak any inductor setting reached
    (``at_floor``: within it either way). ``with_regions=False``
    leaves the ``edgetrain+regions`` rows out (edgetrain's own plans, eager or per-stage compiled, alone);
    ``same_graph``: the fastest is inductor's own graph at that level (no regions, the same budget), a tie
    by construction whatever the clocks say. Rows with the optimizer in the backward (``IN_BACKWARD``) are judged
    against inductor's rows of that contract only, and the others against the others: the floor row of the
    first is named ``floor+step_in_backward``.
    """
    out = []
    def group(row: dict[str, Any]) -> tuple[str, int, bool]:   # a run's rows of one model and one contract
        return row["model"], row.get("run", 0), in_backward(row["setting"])

    for name, run, contract in dict.fromkeys(group(row) for row in rows):
        ran = [row for row in rows if group(row) == (name, run, contract) and "error" not in row]
        inductor = [row for row in ran if row["setting"].startswith("inductor")]
        ours = [row for row in ran if row["setting"].startswith("edgetrain")
                and (with_regions or not whole_graph(row))]
        if not ours:   # a run of yardsticks and regions rows only, without them
            continue
        for level in inductor:
            fitting = [row for row in ours if row["step_tensor_peak_mib"] <= level["step_tensor_peak_mib"]]
            best = min(fitting, key=lambda row: row["step_cpu_time_ratio"], default=None)
            out.append({"model": name, "run": run, "inductor": level["setting"],
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
            out.append({"model": name, "run": run, "inductor": "floor" + (IN_BACKWARD if contract else ""),
                        "inductor_mib": floor,
                        "edgetrain": configuration(least),
                        "edgetrain_mib": least["step_tensor_peak_mib"],
                        "edgetrain_cpu_ratio": least["step_cpu_time_ratio"],
                        "below_floor": least["step_tensor_peak_mib"] < floor * (1 - FLOOR_TIE),
                        "at_floor": abs(least["step_tensor_peak_mib"] - floor) <= floor * FLOOR_TIE})
    return out


def run_header(run: dict[str, Any], models: list[str]) -> list[str]:
    """Markdown lines saying how one run was made: its command, date, software and load."""
    command = " ".join(["python benchmarks/compile_budget.py", "--models", ",".join(models), "--rounds",
                        str(run["rounds"]), "--steps", str(run["steps"]), "--settings", run["settings"]])
    software = run.get("software", {})
    return [f"Written by `{command}` (its docstring says what each column is), {run.get('date', 'date not recorded')}.",
            f"torch {software.get('torch', '?')}, {software.get('cpu', '?')}; load average over the run: "
            f"{run.get('load_average', 'not recorded')}; {run['rounds']} round(s) per setting.",
            *([run["note"]] if run.get("note") else [])]   # what the run's JSON says by hand (a run cut short)


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' JSONs as one: each row tagged with the index of its run under ``runs`` (that run's
    command, date and load), a later run's edgetrain row replacing an earlier one's for the same model and
    setting. An eager or inductor row stays while its run keeps an edgetrain row of that model (it is their
    yardstick: :func:`verdicts` compares rows of one run only), or while it is the latest of its setting.
    A model's rows stay together, in the order they were first run."""
    pairs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []   # (a run's settings, its rows)
    for result in results:
        for index, run in enumerate(result.get("runs", [result])):   # a merged result keeps its runs apart
            rows = [row for row in result["rows"] if row.get("run", 0) == index]
            pairs.append(({k: v for k, v in run.items() if k not in ("rows", "models_given")}, rows))
    latest = {(row["model"], row["setting"]): number for number, (_, rows) in enumerate(pairs) for row in rows}
    measured = {(row["model"], number) for number, (_, rows) in enumerate(pairs) for row in rows
                if row["setting"].startswith("edgetrain") and latest[row["model"], row["setting"]] == number}
    runs: list[dict[str, Any]] = []
    merged: list[dict[str, Any]] = []
    for number, (run, rows) in enumerate(pairs):
        kept = [row for row in rows if latest[row["model"], row["setting"]] == number
                or (not row["setting"].startswith("edgetrain") and (row["model"], number) in measured)]
        if kept:
            merged += [{**row, "run": len(runs)} for row in kept]
            runs.append({**run, "models_given": list(dict.fromkeys(row["model"] for row in kept))})
    order = list(dict.fromkeys(row["model"] for row in merged))
    return {"runs": runs, "rows": sorted(merged, key=lambda row: order.index(row["model"]))}


def spread(row: dict[str, Any], key: str, digits: int) -> str:
    """The median over rounds, with the least and most of them where the rounds differ."""
    low, high = row.get(f"{key}_range", (row[key], row[key]))
    text = f"{row[key]:.{digits}f}"
    return text if f"{low:.{digits}f}" == f"{high:.{digits}f}" else f"{text} ({low:.{digits}f}-{high:.{digits}f})"


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def verdict_table(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`verdicts` as markdown lines."""
    lines = ["| model | run | inductor level | its tensor MiB | its CPU / eager | edgetrain at or below it | "
             "tensor MiB | CPU / eager | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for v in rows:
        if v["inductor"].startswith("floor"):
            verdict = ("trains below inductor's floor" if v["below_floor"] else
                       f"at inductor's floor (within {FLOOR_TIE:.1%}: a tie)" if v.get("at_floor") else
                       "does not reach inductor's floor")
            level = "least of any budget" + (f" ({IN_BACKWARD[1:]})" if v["inductor"] != "floor" else "")
            lines.append(f"| {v['model']} | {v['run'] + 1} | {level} | {mib(v['inductor_mib'])} | | "
                         f"{v['edgetrain']} | "
                         f"{mib(v['edgetrain_mib'])} | {ratio(v['edgetrain_cpu_ratio'])} | {verdict} |")
            continue
        verdict = ("no slower" if v["no_slower"] else "slower") if v["edgetrain"] else "cannot get this low"
        if v.get("inductor_graph") and not v["same_graph"]:   # edgetrain+compiled took another budget's graph
            verdict += ": inductor's own graph at another budget"
        verdict = "the same graph (a tie)" if v["same_graph"] else verdict
        lines.append(f"| {v['model']} | {v['run'] + 1} | {v['inductor']} | {mib(v['inductor_mib'])} | "
                     f"{ratio(v['inductor_cpu_ratio'])} | {v['edgetrain'] or '-'} | {mib(v['edgetrain_mib'])} | "
                     f"{ratio(v['edgetrain_cpu_ratio'])} | {verdict} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The run (or merged runs) as markdown: every setting's row, then the verdict per inductor level."""
    runs = result.get("runs") or merge([result])["runs"]
    lines = ["# torch.compile's activation memory budget against edgetrain, per model", ""]
    for number, run in enumerate(runs, 1):
        lines += ([f"Run {number} of {len(runs)}: {', '.join(run['models_given'])}."] if len(runs) > 1 else [])
        lines += [*run_header(run, run["models_given"]), ""]
    lines += ["The CPU clock's ratio is the time verdict. With several rounds a figure is their median, with the "
              "least and most in parentheses where they differ. A setting with `+step_in_backward` stepped its "
              "optimizer inside the backward, one SGD per parameter (no gradient outlives the backward): its "
              "verdicts compare it with inductor's rows of that contract only.", "",
              "| model | setting | tensor step peak MiB | RSS step peak MiB | RSS between steps MiB | CPU / eager | "
              "step CPU CoV % | wall / eager | planned ρ | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['setting']} | {row['error']} | | | | | | | "
                         f"{row.get('run', 0) + 1} |")
            continue
        lines.append(f"| {row['model']} | {row['setting']} | {spread(row, 'step_tensor_peak_mib', 1)} | "
                     f"{spread(row, 'step_peak_mib', 1)} | {mib(row['rest_rss_mib'])} | "
                     f"{spread(row, 'step_cpu_time_ratio', 2)} | {mib(row.get('step_cpu_cov_pct'))} | "
                     f"{spread(row, 'step_time_ratio', 2)} | "
                     f"{ratio(row.get('recompute_factor'))} | {row.get('run', 0) + 1} |")
    regions_runs = {(row["model"], row.get("run", 0)) for row in result["rows"] if whole_graph(row)}
    lines += ["", "Verdicts by edgetrain's own plans (eager stages, and stages compiled one by one):", "",
              *verdict_table(verdicts(result["rows"], with_regions=False))]
    if regions_runs:
        lines += ["", "Verdicts of the runs with regions rows (`b`: the partitioner's budget the regions graph was "
                  "compiled at):", "",
                  *verdict_table([v for v in verdicts(result["rows"]) if (v["model"], v["run"]) in regions_runs])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18", help="comma-separated, or 'all'")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", default=DEFAULT_SETTINGS)
    parser.add_argument("--out", default="out/compile_budget.json")
    parser.add_argument("--md", help="also write the tables as markdown here")
    parser.add_argument("--render", help="only write --md from this earlier run's JSON")
    parser.add_argument("--merge", help="comma-separated earlier runs' JSONs: write them as one to --out "
                                        "(a later run's rows replace an earlier's for the same model), and --md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--match-step-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.models, args.batch, args.image, args.steps, args.match_step_bytes)
        return
    if args.render:
        Path(args.md).write_text(markdown(json.loads(Path(args.render).read_text())))
        return
    if args.merge:
        merged = merge([json.loads(Path(name).read_text()) for name in args.merge.split(",")])
        Path(args.out).write_text(json.dumps(merged, indent=1))
        if args.md:
            Path(args.md).write_text(markdown(merged))
        return
    from edgetrain.bench.stats import software_setup
    names = all_models() if args.models == "all" else args.models.split(",")
    settings = args.settings.split(",")
    if "eager" not in settings:
        settings.insert(0, "eager")
    rows: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for name in names:
        rounds = []
        for number in range(args.rounds):
            rounds.append(run_round(name, settings, args))
            print(f"{name}: round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        model_rows = summarise(name, settings, rounds)
        print_rows(model_rows)
        rows += model_rows
        loads.append(os.getloadavg()[0])
        result = {**{k: v for k, v in vars(args).items() if k not in ("child", "match_step_bytes", "render", "merge")},
                  "software": software_setup(), "rows": rows,
                  "date": f"{started} - {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
                  "load_average": f"{min(loads):.1f}-{max(loads):.1f} (1-minute, at the start and after each model)"}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        if args.md:
            Path(args.md).write_text(markdown(result))


if __name__ == "__main__":
    main()
