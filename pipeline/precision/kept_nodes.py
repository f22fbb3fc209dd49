"""The fp16 variant's nodes kept in fp32: from the recipe (`[fp16] keep_nodes`), the lock, the
converter's errors (converter_errors.py, inside the conversion) and, when the variant misses a threshold, a
search (ranking.py, search.py) judged by the verify stage's evaluators. Records the decision in
report.json and the lock file (docs/precision.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from pipeline.cache import temporary_folder
from pipeline.graph.model_io import model_bytes
from pipeline.graph.passes.util import subgraphs
from pipeline.lockfile import LockFile
from pipeline.precision.detect import weight_bytes_by_type
from pipeline.precision.fp16 import SAFE_BLOCK_LIST
from pipeline.precision.decision_paths import decision_paths
from pipeline.precision.kernel_hazards import known_kernel_hazards
from pipeline.precision.ranking import NodeStat, RunOutputs, divergent_nodes, nodes_in_order, rank_nodes
from pipeline.precision.search import SearchResult, search_keep_set
from pipeline.progress import Progress
from pipeline.recipe import Recipe

DID_NOT_RUN = "did not run"  # an evaluator's detail for a model that produced no outputs
# A kept set that spends more than this share of fp16's saving (fp32 bytes - all-fp16 bytes) is no
# fp16 variant worth shipping: the search fails instead (fp16 then fails its host check as before).
MAX_KEPT_COST_SHARE = 0.5
# Before a search, the heaviest candidates are tested one at a time with every other candidate kept
# ("all kept but one"): a failure proves that node is in every passing set. At most this many such
# trials, and only where these nodes' weights could together cost more than MAX_KEPT_COST_SHARE.
ELIMINATION_PROBES = 8


@dataclass
class Evaluator:
    """One check an fp16 candidate must pass: `judge(model file)` -> (passed, one-line detail).
    The verify stage makes them (host CPU; WebGPU kernels when available)."""

    name: str
    judge: Callable[[Path], tuple[bool, str]]
    failures: Callable[[Path], dict[str, str]] | None = None  # {output: why} per failing output ("*": did not run)
    # Node-local evaluators (the node audit judges each node on the host's fp32 values): {node: why}
    # for each node the candidate fails, a node that then fails in every candidate leaving it in fp16.
    failing_nodes: Callable[[Path], dict[str, str]] | None = None
    facts: Callable[[], dict] | None = None  # what its trials cost (the node audit: node runs, verdicts reused)
    # Runs a model where this evaluator judges (every output, for the divergence ranking), or None
    # where it cannot run a whole model (the node audit ranks by failing_nodes instead).
    run_outputs: RunOutputs | None = None


@dataclass
class Fp16Context:
    """What the build lends the fp16 search: sample feeds, a runner for the fp32 ranking run, the
    evaluators, the lock file and progress."""

    feeds: dict[str, np.ndarray]
    run_outputs: RunOutputs
    evaluators: list[Evaluator]
    lock: LockFile  # read only: the entry found is `found_lock_entry`, which the build writes
    progress: Progress
    refusal: Callable[[onnx.ModelProto], str | None] | None = None  # onnxruntime's refusal to load, if any
    found_lock_entry: dict | None = None  # set by fp16_with_kept_nodes: the lock's fp16 entry to write


# keep {node: why} -> (fp16 model or None, steps, refusal or None, kept {node: why} incl. the converter's)
Convert = Callable[[dict[str, str]], tuple["onnx.ModelProto | None", list[dict], "str | None", dict[str, str]]]


def _judge_all(converted: onnx.ModelProto, evaluators: list[Evaluator]) -> tuple[bool, str]:
    with temporary_folder("pack-fp16-") as tmp:
        path = Path(tmp) / "fp16.onnx"
        path.write_bytes(model_bytes(converted))
        for evaluator in evaluators:
            passed, detail = evaluator.judge(path)
            if not passed:
                return False, f"{evaluator.name}: {detail}"
    return True, "passes " + ", ".join(e.name for e in evaluators)


def _upstream_nodes(model: onnx.ModelProto, output: str) -> list[onnx.NodeProto]:
    """The nodes `output` depends on, nearest first; a container's dependencies include what its
    bodies compute (their outputs) and the outer values they read."""
    producer = {out: node for node in nodes_in_order(model.graph) for out in node.output}
    seen: set[str] = set()
    found = []
    stack = [output]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node.name not in seen:
            seen.add(node.name)
            found.append(node)
            stack += [*node.input, *(value.name for sub in subgraphs(node) for value in sub.output)]
    return found


def _ancestors(model: onnx.ModelProto, output: str) -> set[str]:
    return {node.name for node in _upstream_nodes(model, output)}


def _search_per_output(model: onnx.ModelProto, ranked: list[str], failures_of: Callable, unfixable: dict, recipe: Recipe, tried: list[int], hopeless: Callable) -> SearchResult | None:
    """One search per failing output, over the ranked nodes that output depends on, each starting
    from the nodes earlier outputs needed: independent failures cost a few trials each instead of
    one search whose every trial must fix them all. All of them share the trial budget; an output
    the budget does not reach keeps its whole ranked cone (not minimal, and said so). None when
    there is a single failing output (the caller searches as before)."""
    import time

    start = time.perf_counter()
    plain = {k: v for k, v in failures_of([]).items() if k not in unfixable}
    targets = sorted({output for _, output in plain})
    if len(targets) < 2 or "*" in targets:
        return None
    fixed: list[str] = []
    minimal, stopped = True, None
    for output in targets:
        def trial(nodes: list[str], output: str = output) -> tuple[bool, str]:
            left = {k: v for k, v in failures_of(fixed + nodes).items() if k[1] == output and k not in unfixable}
            return not left, "; ".join(f"{e}: {o}: {w}" for (e, o), w in left.items()) or "passed"

        if trial([])[0]:
            continue  # the nodes kept for earlier outputs fixed this one too
        cone = _ancestors(model, output)
        pool = [name for name in ranked if name in cone and name not in fixed]
        left_trials = recipe.fp16_search_trials - tried[0]
        proven: list[str] = []  # why the nodes proven needed so far make every result unacceptable

        def stop(nodes: list[str]) -> str | None:
            why = hopeless(fixed + nodes)
            proven.extend([why] if why else [])
            return why

        found = search_keep_set(pool, trial, left_trials, recipe.fp16_search_seconds - (time.perf_counter() - start), stop) if left_trials > 0 else None
        if proven:
            return SearchResult(False, [], tried[0], time.perf_counter() - start, False, proven[0])
        if found is not None and found.passed and found.minimal:
            fixed += found.kept
        else:
            fixed += found.kept if found is not None and found.passed else pool
            minimal = False
            stopped = (found.stopped if found is not None else None) or f"trial budget ({recipe.fp16_search_trials}) spent"
    passed = not any(k not in unfixable for k in failures_of(fixed))
    return SearchResult(passed, fixed if passed else [], tried[0], time.perf_counter() - start, minimal and passed, stopped if passed else (stopped or "the outputs' kept sets together still miss a threshold"))


def _failures_all(converted: onnx.ModelProto, evaluators: list[Evaluator]) -> dict[tuple[str, str], str]:
    """{(evaluator, output): why} for every output each evaluator fails ("*": did not run)."""
    found: dict[tuple[str, str], str] = {}
    with temporary_folder("pack-fp16-") as tmp:
        path = Path(tmp) / "fp16.onnx"
        path.write_bytes(model_bytes(converted))
        for evaluator in evaluators:
            if evaluator.failures is not None:
                found.update({(evaluator.name, output): why for output, why in evaluator.failures(path).items()})
            else:
                passed, detail = evaluator.judge(path)
                if not passed:
                    found[(evaluator.name, "*")] = detail
    return found


def _rounded_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp32 model with every float constant rounded to fp16 and back: weight rounding alone."""
    from onnx import TensorProto, numpy_helper

    from pipeline.graph.passes.util import all_graphs, copy_model

    rounded = copy_model(model)
    for graph in all_graphs(rounded.graph):
        tensors = list(graph.initializer) + [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
        for tensor in tensors:
            if tensor.data_type == TensorProto.FLOAT:
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32), tensor.name))
    return rounded


def _rounded_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp32 model reading its float inputs rounded to fp16: input rounding alone."""
    from onnx import TensorProto, helper

    from pipeline.graph.passes.util import copy_model

    rounded = copy_model(model)
    casts = []
    for value in rounded.graph.input:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            half, back = f"{value.name}__as_fp16", f"{value.name}__rounded"
            casts += [helper.make_node("Cast", [value.name], [half], to=TensorProto.FLOAT16, name=half), helper.make_node("Cast", [half], [back], to=TensorProto.FLOAT, name=back)]
            for node in nodes_in_order(rounded.graph):
                node.input[:] = [back if name == value.name else name for name in node.input]
    nodes = casts + list(rounded.graph.node)
    del rounded.graph.node[:]
    rounded.graph.node.extend(nodes)
    return rounded


def _discrete_upstream(model: onnx.ModelProto, output: str) -> list[str]:
    """Discrete ops (Ceil, ArgMax, comparisons, Cast to int, ...) an output depends on."""
    from pipeline.precision.ranking import is_discrete

    return [f"{node.op_type} '{node.name}'" for node in _upstream_nodes(model, output) if is_discrete(node)]


def diagnose_unfixable(model: onnx.ModelProto, unfixable: dict[tuple[str, str], str], context: Fp16Context, when: str = "with every candidate kept in fp32") -> list[str]:
    unfixable_run = when == "with every candidate kept in fp32"
    """One line per (evaluator, output) that keeping every candidate in fp32 still fails, with the
    figure of what causes it: weight rounding alone, input rounding alone, or a discrete op's flip."""
    host = context.evaluators[:1]
    weights = _failures_all(_rounded_weights(model), host)
    inputs = _failures_all(_rounded_inputs(model), host)
    lines = []
    for (evaluator, output), why in sorted(unfixable.items()):
        causes = []
        if (host[0].name, output) in weights:
            causes.append(f"weight rounding alone costs {weights[(host[0].name, output)]} on `{output}`")
        if (host[0].name, output) in inputs:
            causes.append(f"input rounding alone costs {inputs[(host[0].name, output)]} on `{output}`")
        discrete = _discrete_upstream(model, output)
        if discrete and not causes:
            causes.append(f"a discrete op ({', '.join(discrete[:3])}) flips: keep its input subgraph, or bound `{output}` by what a flip costs")
        fallback = "not weight or input rounding (fp16 kernels of ops the search does not rank)" if unfixable_run else "not weight or input rounding: fp16 kernels, which keeping nodes fixes"
        lines.append(f"{evaluator}: {output}: {why} {when}; " + ("; ".join(causes) if causes else fallback))
    return lines


def kept_weight_floor(model: onnx.ModelProto, nodes: list[str]) -> int:
    """The least a kept set costs over the all-fp16 ideal: half the bytes of each distinct fp32
    initializer (as `_sizes` counts them: the main graph's) that its nodes read, at any graph level;
    a kept node's weights stay fp32. It never falls when nodes are added."""
    sizes = {t.name: (len(t.raw_data) or numpy_helper.to_array(t).nbytes) // 2 for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    names = set(nodes)
    return sum({name: sizes[name] for node in nodes_in_order(model.graph) if node.name in names for name in node.input if name in sizes}.values())


def _all_kept_but_one(model: onnx.ModelProto, pool: list[str], trial: Callable, hopeless: Callable) -> str | None:
    """Why no acceptable kept set exists, proven before the search, or None. Keeping more nodes
    never hurts (the search's own assumption), so a node whose absence from the whole pool already
    fails is in every passing set. The heaviest ELIMINATION_PROBES candidates are tried that way,
    heaviest first, while the nodes proven so far and those left to try could still cost more than
    `hopeless` allows; it returns its reason once the proven ones do."""
    heaviest = sorted((node for node in pool if kept_weight_floor(model, [node])), key=lambda node: -kept_weight_floor(model, [node]))[:ELIMINATION_PROBES]
    proven: list[str] = []
    for index, node in enumerate(heaviest):
        if hopeless(proven + heaviest[index:]) is None:
            return None  # even if every node left were needed, they could not prove it
        if not trial([other for other in pool if other != node])[0]:
            proven.append(node)
            why = hopeless(proven)
            if why:
                return why.replace("stopped early:", f"stopped early (all kept but one, {index + 1} trials):", 1)
    return None


def _sizes(source: onnx.ModelProto, converted: onnx.ModelProto) -> dict:
    """Weight bytes of fp32, of the all-fp16 ideal (every fp32 weight halved) and of the variant."""
    source_weights = weight_bytes_by_type(source)
    ideal = sum(size // 2 if kind == "fp32" else size for kind, size in source_weights.items())
    actual = sum(weight_bytes_by_type(converted).values())
    return {"fp32_bytes": sum(source_weights.values()), "all_fp16_ideal_bytes": ideal, "fp16_bytes": actual, "kept_cost_bytes": actual - ideal}


def _failing_nodes(converted: onnx.ModelProto, evaluators: list[Evaluator]) -> dict[str, tuple[str, str]]:
    """{node: (evaluator, why)} for each node a node-local evaluator (the node audit) fails."""
    found: dict[str, tuple[str, str]] = {}
    local = [e for e in evaluators if e.failing_nodes is not None]
    if not local:
        return found
    with temporary_folder("pack-fp16-") as tmp:
        path = Path(tmp) / "fp16.onnx"
        path.write_bytes(model_bytes(converted))
        for evaluator in local:
            for node, why in evaluator.failing_nodes(path).items():
                found.setdefault(node, (evaluator.name, why))
    return found


def _divergence_first(named: onnx.ModelProto, converted: onnx.ModelProto, failing: dict[tuple[str, str], str], blocked: set[str], context: Fp16Context, ranked: list) -> list:
    """A failure is ranked where it is seen: on each failing evaluator that runs whole models, the
    nodes whose fp16 output adds the most error to the fp32 intermediates there come first (the
    first failing evaluator's first), then the fp32-run ranking."""
    first: dict[str, NodeStat] = {}  # node -> its stat, in rank order
    for evaluator in context.evaluators:
        if evaluator.run_outputs is None or not any(name == evaluator.name for name, _ in failing):
            continue
        for stat in divergent_nodes(named, converted, context.feeds, context.run_outputs, evaluator.run_outputs, blocked):
            if stat.node not in first:
                stat.why = f"{evaluator.name}: {stat.why}"
                first[stat.node] = stat
    return [*first.values(), *(stat for stat in ranked if stat.node not in first)]


def is_shape_failure(why: str) -> bool:
    """A failure that is an output's shape, not its values (judgement/metrics.py `judge` words it
    "shape [..] != expected [..]"): a length or count the fp16 candidate decided differently."""
    return why.startswith("shape ")


def _shapes_first(model: onnx.ModelProto, ranked: list[str], failures_of: Callable, recipe: Recipe, tried: list[int]) -> tuple[dict, list[str]] | None:
    """Outputs whose shape differs from fp32's are fixed first, by a search of their own over the
    ranked nodes they depend on (a discrete op's float inputs rank near the top): no bound on
    values can judge an output of another length, and a numeric search run while a length is
    wrong judges every trial by an output it cannot compare. (its report figures, the nodes it
    keeps), or None when no output has another shape."""
    outputs = sorted({output for (_, output), why in failures_of([]).items() if is_shape_failure(why)})
    if not outputs:
        return None
    cone = set().union(*(_ancestors(model, output) for output in outputs))
    pool = [name for name in ranked if name in cone]

    def trial(nodes: list[str]) -> tuple[bool, str]:
        left = {k: v for k, v in failures_of(nodes).items() if k[1] in outputs and is_shape_failure(v)}
        return not left, "; ".join(f"{e}: {o}: {w}" for (e, o), w in left.items()) or "passed"

    left_trials = recipe.fp16_search_trials - tried[0]
    found = search_keep_set(pool, trial, left_trials, recipe.fp16_search_seconds) if left_trials > 0 and pool else None
    figures = {"outputs": outputs, "candidates": len(pool)}
    if not pool:
        figures["failed"] = "no ranked node that these outputs depend on"
    elif found is None:
        figures["failed"] = f"trial budget ({recipe.fp16_search_trials}) spent"
    elif not found.passed:
        figures["failed"] = found.stopped or "no passing set found"
    if "failed" in figures:
        return figures, []
    figures.update(kept=found.kept, minimal=found.minimal)
    return figures, found.kept


def _search(named: onnx.ModelProto, converted: onnx.ModelProto, kept: dict[str, str], detail: str, recipe: Recipe, convert: Convert, context: Fp16Context) -> tuple[dict, onnx.ModelProto, dict[str, str]]:
    """The search for nodes to keep in fp32 when `converted` misses a threshold ("first failure"
    `detail`): (its report figures, the fp16 model, kept {node: why}). Nodes a node-local
    evaluator (the node audit) fails are ranked first and kept without bisecting: each fails in
    every candidate that leaves it in fp16; when they alone pass, no ranking run is needed."""
    import time

    started = time.perf_counter()
    context.progress.note(f"fp16 misses a threshold ({detail}); searching for nodes to keep in fp32")
    ops = {n.name: n.op_type for n in nodes_in_order(named.graph)}
    needed = {node: found for node, found in _failing_nodes(converted, context.evaluators).items() if node not in kept and node in ops}
    why = {node: f"search: {evaluator} {reason}" for node, (evaluator, reason) in needed.items()}
    tried = [0]
    outcomes: dict[frozenset, dict[tuple[str, str], str]] = {}
    unfixable: dict[tuple[str, str], str] = {}
    pool: list[str] = []

    shaped: list[str] = []  # kept first, to give every output fp32's shape (_shapes_first)

    def failures_of(nodes: list[str]) -> dict[tuple[str, str], str]:
        key = frozenset([*needed, *shaped, *nodes])
        if key not in outcomes:
            tried[0] += 1
            context.progress.note(f"fp16 search trial {tried[0]}/{recipe.fp16_search_trials}: {len(key)} nodes kept in fp32 ({len(needed)} named by the node audit)")
            candidate, _, refused_now, _ = convert({**kept, **{n: why[n] for n in key}})
            outcomes[key] = {("*", "*"): refused_now} if refused_now else _failures_all(candidate, context.evaluators)
        return outcomes[key]

    def trial(nodes: list[str]) -> tuple[bool, str]:
        # Each output (and evaluator) on its own: what keeping every candidate cannot fix
        # does not hide what it can.
        left = {k: v for k, v in failures_of(nodes).items() if k not in unfixable}
        return not left, "; ".join(f"{e}: {o}: {w}" for (e, o), w in left.items()) or "passed"

    ranked: list = []
    shape_first = None
    if needed and trial([])[0]:
        result = SearchResult(True, [], tried[0], time.perf_counter() - started, True)
    else:
        blocked = set(SAFE_BLOCK_LIST) | set(recipe.fp16_block_ops)
        ranked = _divergence_first(named, converted, failures_of([]), blocked, context, rank_nodes(named, context.feeds, context.run_outputs, blocked))
        ranked = [stat for stat in ranked if stat.node not in kept and stat.node not in needed]
        why.update({stat.node: f"search: {stat.why}" for stat in ranked})
        pool = [stat.node for stat in ranked]
        shape_first = _shapes_first(named, pool, failures_of, recipe, tried)
        if shape_first is not None:
            search_shapes, found_shaped = shape_first
            shaped += found_shaped
            why.update({node: f"{why[node]}; keeps the shape fp32 gives {', '.join(f'`{o}`' for o in search_shapes['outputs'])}" for node in found_shaped})
            pool = [node for node in pool if node not in shaped]
        # Keeping every candidate shows what no node choice fixes (one trial, reused by the search).
        everything = failures_of(pool)
        if not any(k == ("*", "*") or k[1] == "*" for k in everything):
            unfixable.update(everything)
        if (unfixable or needed or shaped) and trial([])[0]:
            result = SearchResult(True, [], tried[0], time.perf_counter() - started, True, None if needed else "keeping nodes in fp32 fixes none of the failures")
        else:
            sizes = _sizes(named, named)
            cost_limit = MAX_KEPT_COST_SHARE * (sizes["fp32_bytes"] - sizes["all_fp16_ideal_bytes"])

            def hopeless(nodes: list[str]) -> str | None:
                # every result contains these nodes (and the ones kept before the search), each keeping the fp32 weights it reads
                floor = kept_weight_floor(named, [*kept, *needed, *shaped, *nodes])
                if floor > cost_limit:
                    return (f"stopped early: the {len(nodes)} nodes proven needed keep at least {floor:,} B of weights in fp32, more than half of "
                            f"fp16's saving ({int(2 * cost_limit):,} B): every kept set that passes contains them")
                return None

            before_probes = tried[0]
            proof = _all_kept_but_one(named, pool, trial, hopeless)
            # the probes do not spend the search's budget: a search that passes finds the same set with or without them
            probes, tried[0] = tried[0] - before_probes, before_probes
            if proof:
                result = SearchResult(False, [], tried[0], time.perf_counter() - started, False, proof)
            else:
                result = _search_per_output(named, pool, failures_of, unfixable, recipe, tried, hopeless)
                if result is None:
                    result = search_keep_set(pool, trial, max(recipe.fp16_search_trials - tried[0], 1), recipe.fp16_search_seconds, hopeless)
            tried[0] += probes
    if result.passed:
        result.kept = [*needed, *shaped, *result.kept]
    result.trials = tried[0]
    search = {**result.figures(), "candidates": len(needed) + len(shaped) + len(pool), "first_failure": detail, "evaluators": [e.name for e in context.evaluators]}
    if shape_first is not None:
        search["shapes_first"] = shape_first[0]
    costs = {e.name: e.facts() for e in context.evaluators if e.facts is not None}
    if costs:
        search["evaluator_costs"] = costs
    if needed:
        search["node_failures"] = [{"node": node, "op": ops[node], "evaluator": evaluator, "why": reason} for node, (evaluator, reason) in needed.items()]
    if unfixable:
        search["unfixable"] = diagnose_unfixable(named, unfixable, context)
        context.progress.note("fp16: no node choice fixes " + "; ".join(search["unfixable"]))
    found = {**kept, **{n: why[n] for n in result.kept}}
    candidate = convert(found)[0] if result.passed else None
    sizes = _sizes(named, candidate) if candidate is not None else None
    if candidate is None:
        search["failed"] = result.stopped or "no passing set found"
    elif sizes["kept_cost_bytes"] > MAX_KEPT_COST_SHARE * (sizes["fp32_bytes"] - sizes["all_fp16_ideal_bytes"]):
        search["failed"] = f"the {len(result.kept)} nodes that pass keep {sizes['fp16_bytes']} of {sizes['fp32_bytes']} bytes: more than half of fp16's saving lost"
    else:
        converted, kept = candidate, found
    if "failed" in search:
        # What the search could not get below the bounds, and why: the figure of each cause.
        search["diagnosis"] = diagnose_unfixable(named, {k: v for k, v in failures_of([]).items() if k[1] != "*"}, context, f"with only the {len(needed)} nodes the node audit names kept in fp32" if needed else "with no node kept in fp32")
    search["ranked"] = ([{"node": node, "op": ops[node], "why": why[node]} for node in needed] + [stat.as_dict() for stat in ranked])[:10]
    return search, converted, kept


def fp16_with_kept_nodes(named: onnx.ModelProto, recipe: Recipe, convert: Convert, steps: list[dict], refused: dict[str, str], context: Fp16Context | None) -> tuple[onnx.ModelProto, list[dict]] | None:
    """(fp16 model, kept [{node, op, why}]) for the (named) fp32 model, or None when fp16 is
    refused (the reason goes to `refused`). Appends report steps (a `fp16_keep_fp32` step among
    them) to `steps` and sets the lock entry it found (`context.found_lock_entry`)."""
    model_sha = hashlib.sha256(model_bytes(named)).hexdigest()
    keep = {name: "recipe key fp16.keep_nodes" for name in recipe.fp16_keep_nodes}
    record: dict = {}
    locked = context.lock.get(recipe.name, "fp16") if context else None
    from_lock = False
    if locked is not None:
        if locked.get("model_sha256") == model_sha:
            keep.update({entry["node"]: entry["why"] for entry in locked.get("kept", [])})
            from_lock = True
            record["lock"] = f"applied {context.lock.path.name}: {len(locked.get('kept', []))} nodes kept in fp32, no search"
        else:
            note = f"lock {context.lock.path.name}: its fp16 entry is for another model (sha256 {str(locked.get('model_sha256'))[:12]}, now {model_sha[:12]}); finding the nodes to keep again"
            context.progress.note(note)
            record["lock"] = note
    shapes = {name: tuple(np.asarray(value).shape) for name, value in context.feeds.items()} if context else None
    for name, why in known_kernel_hazards(named, shapes).items():
        keep.setdefault(name, why)
    for name, why in decision_paths(named).items():
        keep.setdefault(name, why)
    converted, conversion_steps, refusal, kept = convert(keep)
    steps.extend(conversion_steps)
    if refusal:
        refused["fp16"] = refusal
        return None
    search = None
    if context and context.evaluators and recipe.fp16_search and not from_lock:
        passed, detail = _judge_all(converted, context.evaluators)
        if not passed and DID_NOT_RUN not in detail:
            search, converted, kept = _search(named, converted, kept, detail, recipe, convert, context)
    nodes = {n.name: n.op_type for n in nodes_in_order(named.graph)}
    kept_list = [{"node": name, "op": nodes.get(name, "?"), "why": why} for name, why in sorted(kept.items())]
    if kept_list or search:
        record.update(kept=kept_list, sizes=_sizes(named, converted))
        if search:
            record["search"] = search
        summary = f"{len(kept_list)} node{'s' if len(kept_list) != 1 else ''} kept in fp32"
        if search:
            summary += f"; search: {search['trials']} trials in {search['seconds']:.1f} s" + (f" ({search['failed']})" if "failed" in search else "")
        record["what"] = summary
        steps.append({"name": "fp16_keep_fp32", "changed": bool(kept_list), "records": [record]})
        if context and not from_lock and (search is None or "failed" not in search):
            context.found_lock_entry = {"model_sha256": model_sha, "kept": kept_list, "search": {k: search[k] for k in ("trials", "seconds", "minimal", "stopped")} if search else None}
    elif "lock" in record:
        steps.append({"name": "fp16_keep_fp32", "changed": False, "records": [{**record, "what": record["lock"]}]})
    return converted, kept_list
