"""Checkers for notebook 06 (loading across devices).

- `check_gpu_checkpoint_on_cpu`: a GPU training checkpoint (saved from a DataParallel model) loaded into a
  model on the CPU with plain PyTorch. In a notebook it also reads the cells run since the model was built,
  to see whether a `course_utils.checkpoints.loading` helper (which the exercise rules out),
  ``torch.load(..., weights_only=False)`` or ``load_state_dict(..., strict=False)`` was used
  (``_answer_cells``); and it compares the version counters of the model's tensors with those of the same
  class freshly built, to tell weights never written from weights changed after loading (``_written``).
- `check_two_prefix_repair`: a student's ``repair(state_dict)``, called on state_dicts with both wrapper
  prefixes (in either order), one of them, or none, of `TwoPart` and of a deeper model with a layer of its
  own called ``module`` (`Deeper`).
"""

from __future__ import annotations

import ast
import copy
import inspect
import linecache
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoints.loading import CheckpointError, find_state_dict, load_checkpoint, strip_prefixes
from . import Verdict, exercise, fail, ok

__all__ = ["Deeper", "check_gpu_checkpoint_on_cpu", "check_two_prefix_repair"]

HELPERS = {  # helper -> (the steps of §1 it does, what plain PyTorch does in its place)
    "load_weights": ("all three", "torch.load(..., map_location=...), then model.load_state_dict(...) with keys "
                                  "that fit"),
    "load_checkpoint": ("where the tensors go", "torch.load(path, map_location=...)"),
    "read_state_dict": ("where the tensors go and where the weights sit in the file",
                        "torch.load(path, map_location=...), then the entry of the dict that holds the weights"),
    "find_state_dict": ("where the weights sit in the file", "the entry of the loaded dict that holds the "
                                                             "weights (print its keys)"),
    "strip_prefixes": ("what the keys look like", "a new dict whose keys lose DataParallel's prefix at their "
                                                  "start"),
}
"""The `course_utils.checkpoints.loading` helpers that exercise 1 rules out: it is about doing their steps by hand."""


# --- exercise 1: a GPU checkpoint into a model on the CPU ------------------------------------------

def _answer_cells(model: Any) -> list[str] | None:
    """In a notebook: the code of the cells run since the latest one that built ``model`` (a cell that calls
    its class, ``TinyClassifier(``), up to the cell that called the checker; None outside a notebook cell.

    The checker reads them for the calls it cannot see in the model: a helper that the exercise rules out,
    ``load_state_dict(..., strict=False)``. A cell run earlier than the one that built the model (the
    lesson's own use of ``load_weights``) does not count."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the course
        return None
    shell = get_ipython()
    if shell is None:
        return None
    user = (getattr(shell, "user_global_ns", None), getattr(shell, "user_ns", None))
    frame = inspect.currentframe()
    while frame is not None and not any(frame.f_globals is ns for ns in user if ns is not None):
        frame = frame.f_back
    if frame is None:  # not called from a cell (a test, a module)
        return None
    cells = [str(c) for c in shell.history_manager.input_hist_parsed]
    current = "".join(linecache.getlines(frame.f_code.co_filename))
    if current.strip() and (not cells or cells[-1].strip() != current.strip()):
        cells.append(current)  # the calling cell, when it was run without being stored in the history
    built = f"{type(model).__name__}("
    start = max((i for i, cell in enumerate(cells) if built in cell), default=len(cells) - 1)
    return cells[max(start, 0):]


def _calls(cells: list[str]) -> list[ast.Call]:
    found = []
    for cell in cells:
        try:
            tree = ast.parse(cell)
        except SyntaxError:  # a cell with IPython syntax left in it: nothing to read
            continue
        found += [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return found


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _weights_only_false(call: ast.Call) -> bool:
    """``torch.load(..., weights_only=False)`` (the argument is keyword-only)."""
    return _name(call) == "load" and any(
        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is not None
        and not k.value.value for k in call.keywords)


def _not_strict(call: ast.Call) -> bool:
    """``load_state_dict(..., strict=False)`` (or ``strict`` given as a second positional argument)."""
    flags = [k.value for k in call.keywords if k.arg == "strict"] + call.args[1:2]
    return any(isinstance(f, ast.Constant) and not f.value for f in flags)


def _written(model: nn.Module) -> set[str] | None:
    """The names of the model's tensors written in place since it was built: their version counter is past
    that of the same class freshly built (on the meta device: no memory, no random numbers drawn). Building
    writes its random weights once; ``load_state_dict`` copies into them, an optimizer step updates them.
    None when the class cannot be built without arguments."""
    try:
        with torch.device("meta"):
            fresh = type(model)()
        built = {k: t._version for k, t in fresh.state_dict(keep_vars=True).items()}
    except Exception:
        return None
    return {k for k, t in model.state_dict(keep_vars=True).items() if k in built and t._version > built[k]}


def _listed(keys: list[str], one: str, several: str) -> str:
    """``keys`` joined, with the verb that agrees with their number: ``_listed(["a"], "holds", "hold")``."""
    return f"{', '.join(keys)} {one if len(keys) == 1 else several}"


def _loads(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The checkpoint's weights without prefixes, and the keys as saved."""
    raw = find_state_dict(load_checkpoint(path, map_location="cpu"), os.fspath(path))
    return dict(strip_prefixes(raw)), list(raw)


@exercise
def check_gpu_checkpoint_on_cpu(model: Any, path: str | os.PathLike[str], code: list[str] | None = None) -> Verdict:
    """Exercise: the GPU checkpoint at ``path`` loaded into ``model``, which is on the CPU, with plain PyTorch.

    ``code``: the answer's cells, to look for a helper of `course_utils.checkpoints.loading` (ruled out),
    ``torch.load(..., weights_only=False)`` (a checkpoint of weights never needs it) and
    ``load_state_dict(..., strict=False)``; by default, in a notebook, `_answer_cells(model)`. Every tensor
    must equal the checkpoint's exactly (``torch.equal``), with the checkpoint's dtype, and the model must be
    as it was built otherwise: its parameters requiring grad, in training mode."""
    if code is None:
        code = _answer_cells(model)
    if isinstance(model, Mapping):
        return fail("you passed a dict (what torch.load returned), not the model.",
                    "torch.load only reads the file into a dict; the exercise is about getting those values into "
                    "the model (§1, the cell after Error 1).",
                    "Pass clf, after loading the weights into it.")
    if not isinstance(model, nn.Module):
        return fail(f"expected the model (an nn.Module), got {type(model).__name__}.",
                    "Pass the model you loaded the weights into: clf.")
    calls = _calls(code or [])
    used = [h for h in HELPERS if h in {_name(c) for c in calls}]
    if used:
        names = " and ".join(used)
        return fail(f"your code calls {', '.join(used)} from course_utils.checkpoints.loading: the exercise asks you to "
                    "do its steps yourself.",
                    f"Which steps {'does' if len(used) == 1 else 'do'} {names} do for you? §1 names them: where "
                    "the tensors go, where the weights sit in the file, what the keys look like ("
                    + "; ".join(f"{h}: {HELPERS[h][0]}" for h in used) + ").",
                    "With torch: " + "; ".join(f"in place of {h}, {HELPERS[h][1]}" for h in used) + ".")
    if any(_weights_only_false(c) for c in calls):
        return fail("your code loads the checkpoint with torch.load(..., weights_only=False): that runs whatever "
                    "code the file's pickle contains, and a checkpoint of weights never needs it.",
                    "§4: the safe default (weights_only=True) rebuilds tensors, numbers, strings and containers, "
                    "which is all this file holds; weights_only=False is only for files you trust that hold "
                    "more than that.",
                    "Leave weights_only out: torch.load(EXERCISE, map_location=...) loads this file safely.")
    try:
        want, saved_keys = _loads(path)
    except CheckpointError as exc:
        return fail(f"the checker cannot read the checkpoint: {exc}")
    if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
        return fail("you passed the DataParallel wrapper, not the plain model.",
                    "The exercise loads into the plain model, whose keys have no 'module.' prefix: make the "
                    "checkpoint's keys fit the model, not the model fit the keys.",
                    "Pass clf itself, with the weights loaded into it.")
    have = model.state_dict()
    if set(have) != set(want):
        return fail(f"the model's keys {sorted(have)[:3]}... are not the checkpoint's {sorted(want)[:3]}....",
                    "Build the model with the class given in the exercise (TinyClassifier).")
    devices = sorted({str(t.device) for t in have.values()})
    if devices != ["cpu"]:
        return fail(f"the model's weights are on {', '.join(devices)}, not on the CPU.",
                    "The exercise wants the model on the CPU: where did it, or its weights, move? (§2)")
    dtypes = sorted({str(have[k].dtype) for k in want if have[k].dtype != want[k].dtype})
    if dtypes:
        return fail(f"the model's weights are {', '.join(dtypes)}; the checkpoint's are "
                    f"{next(iter(want.values())).dtype}.",
                    "Load the weights as they were saved; changing the model's dtype is not part of the exercise.")
    differ = [k for k, v in want.items() if have[k].shape != v.shape or not torch.equal(have[k], v)]
    if differ:
        return _not_loaded(model, want, differ, saved_keys, code)
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    evaluating = [name or type(model).__name__ for name, m in model.named_modules() if not m.training]
    if frozen or evaluating:
        changed = []
        if frozen:
            changed.append(f"requires_grad is False for {len(frozen)} of its {len(list(model.parameters()))} "
                           f"parameters ({', '.join(frozen[:4])})")
        if evaluating:
            changed.append("it is in eval mode (model.training is False)" if not model.training
                           else f"{_listed(evaluating[:4], 'is', 'are')} in eval mode (training is False)")
        return fail(f"the weights are the checkpoint's, but the model is not as it was built: "
                    f"{'; and '.join(changed)}.",
                    "The exercise changes the model's weights and nothing else: loading leaves whether parameters "
                    "are trained (requires_grad) and the training/eval mode as they were, and the caller decides "
                    "those.",
                    "Leave out " + " and ".join(
                        (["requires_grad_(False)"] if frozen else []) + (["eval()"] if evaluating else []))
                    + ": return clf as load_state_dict leaves it.")
    return ok(f"all {len(want)} tensors of the GPU checkpoint are in the model, on the CPU.")


def _not_loaded(model: nn.Module, want: Mapping[str, torch.Tensor], differ: list[str], saved_keys: list[str],
                code: list[str] | None) -> Verdict:
    """The verdict for a model some of whose tensors (``differ``) do not hold the checkpoint's values: never
    written since the model was built (nothing loaded into them), or written and then changed."""
    calls = _calls(code or [])
    not_strict = any(_name(c) == "load_state_dict" and _not_strict(c) for c in calls)
    called = any(_name(c) == "load_state_dict" for c in calls)
    written = _written(model) or set()
    prefixed = all(k.startswith("module.") for k in saved_keys)
    why = " Every weight in the file is named 'module.…' (its model was wrapped in DataParallel)." if prefixed else ""
    named = ("every key in the file starts with 'module.' (its model was wrapped in DataParallel)" if prefixed
             else "compare the file's keys with the model's")
    changed = [k for k in differ if k in written]  # written since built, yet not the checkpoint's values
    untouched = [k for k in differ if k not in written]
    if len(differ) == len(want) and changed:
        what = (", and they are not the random values the model was built with either: something changed the "
                "weights after loading (a training step, an in-place operation on a parameter?)." if not untouched else
                f": {_listed(changed, 'was', 'were')} written since the model was built (a training step, an "
                f"in-place operation?), and {_listed(untouched, 'still has', 'still have')} the random values it "
                "was built with.")
        return fail(f"none of the model's {len(want)} tensors holds the checkpoint's values{what}",
                    "The exercise wants the model as loaded: the checker compares every tensor with the "
                    "checkpoint's, exactly. What ran on the model between loading and the check?",
                    "Build and load the model again, then call the checker, with nothing in between that updates "
                    "the weights (an optimizer step, an in-place change such as mul_ or copy_).")
    if len(differ) == len(want):
        if not_strict:
            return fail("load_state_dict(..., strict=False) loaded nothing: none of the model's "
                        f"{len(want)} tensors holds the checkpoint's values. strict=False skips every key that "
                        f"is not one of the model's, instead of raising, and here none was.{why}",
                        "Look at what load_state_dict(..., strict=False) returns: its missing and unexpected "
                        "keys say why nothing matched (§1, Error 2).",
                        "Make the keys fit the model first (DataParallel's prefix, §1), and load with the "
                        "default strict=True, so that a mismatch raises instead of loading nothing.")
        if called:
            return fail(f"none of the model's {len(want)} tensors holds the checkpoint's values: it still has the "
                        "random weights it was built with, although your code calls load_state_dict. Did that "
                        f"call raise, or load into another model?{why}",
                        "load_state_dict raises when the keys do not fit the model, and loads nothing then: read "
                        "its error (§1, Error 2).",
                        "Make the keys fit the model (DataParallel's prefix, §1), then run load_state_dict on clf "
                        "and the check, in that order.")
        unseen = "" if code is not None else (" If you did call load_state_dict(..., strict=False): it skipped "
                                              "every key, instead of raising.")
        return fail(f"none of the model's {len(want)} tensors holds the checkpoint's values: it still has the "
                    "random weights it was built with.",
                    "torch.load only reads the file into a dict: what copies a dict of weights into a model? "
                    "(§1, the cell after Error 1)",
                    "model.load_state_dict(weights), with the weights found in the checkpoint and their keys "
                    f"made to fit the model: {named}.{unseen}")
    loaded = [k for k in want if k not in differ]
    parts = []
    if untouched:
        parts.append(f"{_listed(untouched, 'does', 'do')} not{' (strict=False skipped them)' if not_strict else ''}")
    if changed:
        parts.append(f"{_listed(changed, 'was', 'were')} changed after loading (a training step, an in-place "
                     "operation?)")
    return fail(f"{_listed(loaded, 'holds', 'hold')} the checkpoint's values, but {'; and '.join(parts)}.",
                "Every key of the model must get its tensor, and keep it: compare the checkpoint's keys with the "
                "model's, and look at what ran on the model after loading.",
                "Make every key fit, then load with strict=True: it raises and lists any key that does not. "
                "Change nothing in the model between loading and the check.")


# --- exercise 2: two prefixes ----------------------------------------------------------------------

_CASES = (  # (prefix added to every key, where such a state_dict comes from)
    ("module._orig_mod.", "a compiled model wrapped in DataParallel (the exercise's `broken`)"),
    ("_orig_mod.module.", "a DataParallel or DDP model, then compiled (torch.compile(ddp_model))"),
    ("module.", "a model wrapped in DataParallel or DDP only"),
    ("_orig_mod.", "a compiled model only"),
    ("", "a plain model (no wrapper: nothing to remove)"),
)
_WRAPPERS = ("module.", "_orig_mod.")


class _Residual(nn.Module):
    """``x + module(x)``: a block of the model's own that keeps its layer in an attribute named ``module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.module(x)


class Deeper(nn.Module):
    """The checker's second model: keys of three parts (``encoder.0.weight``) and a layer of its own called
    ``module`` (``block.module.weight``). Only removing the wrappers' prefixes at the start of a key fits it:
    not keeping the last two parts of a key, nor dropping every ``module`` part wherever it is."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.block = _Residual(nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.encoder(x)))


def _prefixed(model: nn.Module, prefix: str) -> OrderedDict[str, torch.Tensor]:
    """``model``'s state_dict as the wrappers that add ``prefix`` would save it: every key with the prefix, and
    the ``_metadata`` (module versions) that a real state_dict carries, with the wrappers' own entries."""
    own = model.state_dict()
    out: OrderedDict[str, torch.Tensor] = OrderedDict((prefix + k, v) for k, v in own.items())
    metadata = getattr(own, "_metadata", None)
    if isinstance(metadata, Mapping):
        parts = prefix.split(".")[:-1]  # "module._orig_mod." -> ["module", "_orig_mod"]
        meta: OrderedDict[str, Any] = OrderedDict((".".join(parts[:i]), dict(metadata.get("", {})))
                                                  for i in range(len(parts)))  # the wrappers' own entries
        for key, value in metadata.items():
            meta[prefix + key if key else prefix[:-1]] = dict(value)
        out._metadata = meta  # type: ignore[attr-defined]
    return out


def _strip(key: str) -> str:
    while key.startswith(_WRAPPERS):
        for prefix in _WRAPPERS:
            key = key.removeprefix(prefix)
    return key


def _difference(value: Any, original: torch.Tensor) -> str | None:
    """How ``value`` differs from ``original`` (None: the same tensor values), never raising: device, dtype
    and shape are compared before the values (``torch.equal`` raises on a meta tensor)."""
    if not isinstance(value, torch.Tensor):
        return f"it is a {type(value).__name__}, not a tensor"
    if value.device != original.device:
        return f"it is on {value.device}, the state_dict's is on {original.device}"
    if value.dtype != original.dtype:
        return f"it is {value.dtype}, the state_dict's is {original.dtype}"
    if value.shape != original.shape:
        return f"its shape is {tuple(value.shape)}, the state_dict's is {tuple(original.shape)}"
    try:
        same = torch.equal(value, original)
    except Exception as exc:
        return f"it cannot be compared with the state_dict's ({type(exc).__name__})"
    return None if same else "its values differ"


_IN_PLACE = ("The exercise asks for a new dict and the argument unchanged: the caller may still need the original. "
             "Which of your operations work in place? (§1: consume_prefix_in_state_dict_if_present does)")


def _repair_problem(repair: Callable[..., Any], model: nn.Module, prefix: str) -> Verdict | None:
    """What is wrong with ``repair`` on the state_dict of ``model`` with ``prefix`` on every key (None: right)."""
    given = _prefixed(model, prefix)
    before = [(k, v, v.clone()) for k, v in given.items()]
    meta_before = copy.deepcopy(getattr(given, "_metadata", None))
    try:
        repaired = repair(given)
    except Exception as exc:
        return fail(f"your function raised {type(exc).__name__}: {exc}",
                    "Does it count on particular key names, or on both prefixes being there?",
                    "Work key by key: remove from its start whatever wrapper prefixes it has.")
    if [(k, id(v)) for k, v in given.items()] != [(k, id(v)) for k, v, _ in before]:
        return fail(f"your function changed the dict it was given: its keys are now {list(given)[:2]}..., "
                    f"they were {[k for k, _, _ in before][:2]}....", _IN_PLACE,
                    "Build a new dict from state_dict.items(), or work on a copy (dict(state_dict)).")
    if any(_difference(v, saved) is not None for _, v, saved in before):
        return fail("your function changed the tensors of the dict it was given.", _IN_PLACE,
                    "Build a new dict from state_dict.items(), or work on a copy (dict(state_dict)).")
    meta_after = getattr(given, "_metadata", None)
    if meta_before is not None and meta_after != meta_before:
        now = list(meta_after)[:3] if isinstance(meta_after, Mapping) else "gone"
        return fail("your function changed the dict it was given: not its entries, but its _metadata (the module "
                    f"versions that load_state_dict reads), whose keys are now {now}; they were "
                    f"{list(meta_before)[:3]}.",
                    "The argument's _metadata must stay as it was too: does your copy have its own, or share the "
                    "argument's? A shallow copy of a state_dict keeps the same _metadata object, and "
                    "consume_prefix_in_state_dict_if_present renames its keys in place (§1).",
                    "copy.copy(state_dict) shares _metadata with the argument: build a new dict from "
                    "state_dict.items(), or copy with OrderedDict(state_dict), which takes the entries only.")
    if repaired is None:
        return fail("your function returned None.", "A function that builds a new dict must return it.",
                    "End repair with `return` and the dict you built.")
    if not isinstance(repaired, Mapping):
        return fail(f"expected a dict of weights, got {type(repaired).__name__}.",
                    "Return a dict from names to tensors, like the state_dict you were given.")
    want = model.state_dict()
    still = [k for k in repaired if isinstance(k, str) and k.startswith(_WRAPPERS) and _strip(k) in want]
    if still:
        return fail(f"some keys still start with a wrapper prefix, e.g. {still[0]!r}.",
                    "Each wrapper adds its own prefix at the start of every key (§1: DataParallel, §3: "
                    "torch.compile). How many wrappers did this model have?",
                    "Remove 'module.' and '_orig_mod.' from the start of a key for as long as it starts with "
                    "one of them, in whichever order they come.")
    lost = [k for k in repaired if k not in want]
    missing = [k for k in want if k not in repaired]
    if lost and not missing:
        return fail(f"your dict has every key of the model, and more that it does not have: {lost[:3]}.",
                    "The repaired dict holds the model's weights and nothing else: load_state_dict, strict by "
                    "default, refuses a key that the model does not have.",
                    "Put only the entries of state_dict into the new dict, each with its key repaired.")
    if lost:
        return fail(f"keys that the model does not have: {lost[:3]} (it has {sorted(want)[:2]}...).",
                    "A prefix is only at the start of a key: does your way of removing it also cut text "
                    "elsewhere, or cut a fixed number of characters or parts? (§1, the str.replace pitfall)",
                    "str.removeprefix touches only the start of a string, and only when the prefix is there.")
    if missing:
        return fail(f"keys missing from your dict: {missing[:3]}.", "Keep every entry of the state_dict.")
    originals = dict(zip(want, given.values(), strict=True))
    for key, value in repaired.items():
        problem = _difference(value, originals[key])
        if problem is not None:
            return fail(f"{key} does not hold the same tensor as the state_dict it came from: {problem}.",
                        "Change the keys, not the values.",
                        "Put each value into the new dict as it was given (no conversion, no copy to another "
                        "device or dtype): only its key changes.")
    try:
        model.load_state_dict(repaired)  # its own values: nothing changes
    except Exception as exc:  # pragma: no cover - keys and values were checked above
        return fail(f"load_state_dict refused it: {str(exc).splitlines()[0]}")
    return None


@exercise
def check_two_prefix_repair(repair: Callable[..., Any], model: nn.Module) -> Verdict:
    """Exercise: ``repair(state_dict)`` returns a new dict whose keys fit ``model``, and leaves its argument
    unchanged (its ``_metadata`` too), for ``model``'s weights saved with each prefix of ``_CASES``: both
    wrappers (in either order), one, or none; then the same for `Deeper`, whose own layer ``block.module``
    is named like DataParallel's wrapper. The values must be the same tensors (dtype and device included)."""
    if not callable(repair):
        return fail(f"expected your function repair, got {type(repair).__name__}.",
                    "Pass the function itself: check_two_prefix_repair(repair, TwoPart()).")
    name = type(model).__name__
    for i, (prefix, source) in enumerate(_CASES):
        problem = _repair_problem(repair, model, prefix)
        if problem is None:
            continue
        if i == 0:
            return problem
        example = next(iter(_prefixed(model, prefix)))
        return fail(f"right for `broken`, but not for the state_dict of {source}, with keys like "
                    f"{example!r}: {problem.message}",
                    "A checkpoint can come from a model with either wrapper, both (in either order) or none: "
                    "remove the prefixes that are there, not a fixed sequence or a fixed number of characters.",
                    problem.closer or problem.hint)
    deeper = Deeper()
    for prefix, source in _CASES:
        problem = _repair_problem(repair, deeper, prefix)
        if problem is None:
            continue
        example = list(_prefixed(deeper, prefix))[2]  # a key of block.module
        source = source.split(" (")[0]  # without "(the exercise's `broken`)": that is TwoPart's
        return fail(f"right for {name}, but not for a deeper model, saved from {source}, whose own block keeps "
                    f"its layer in an attribute named `module`, with keys like {example!r}: {problem.message}",
                    "Only the prefixes at the start of a key come from wrappers: a model's own layer can be "
                    "called `module` too, deeper in the key, and a key can have more than two parts. Remove the "
                    "wrappers' prefixes from the start, and keep the rest of the key as it is.",
                    problem.closer or problem.hint)
    return ok(f"keys repaired for {name}, and for a deeper model with a layer of its own called `module`, whichever "
              "wrappers saved them (both, in either order, one, or none), and the argument left unchanged.")
