"""A catalogue of answers to notebook 06's exercises (course_utils.exercises.loading_across_devices), as a class
would write them: plausible wrong answers, each rejected with a message that names its mistake and a hint that
names the concept (never the solution's line), and right answers written differently from the notebook's
solution, each accepted."""

from __future__ import annotations

import copy
import inspect
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import IPython
import pytest
import torch
from answers_helpers import ROOT, cell, cell_defs, rejected
from conftest import notebook_solution
from IPython.core.interactiveshell import InteractiveShell
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from traitlets.config import Config

from course_utils.checkpoints.loading import load_checkpoint, load_weights, strip_prefixes
from course_utils.exercises import Verdict
from course_utils.exercises import loading_across_devices as lad
from course_utils.exercises.loading_across_devices import check_gpu_checkpoint_on_cpu, check_two_prefix_repair
from course_utils.models import FooNet, TinyClassifier

NB06 = "06_loading_across_devices"
EXERCISE = str(ROOT / "notebooks" / "data" / "06_exercise_classifier.pt")


# ================================================================ 06, exercise 1: a GPU checkpoint on the CPU

def _weights() -> dict[str, torch.Tensor]:
    return torch.load(EXERCISE, map_location="cpu")["state_dict"]


def test_gpu_checkpoint_the_notebooks_stub_and_solution(capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[Verdict] = []
    namespace = {"torch": torch, "have_gpu_files": True, "EXERCISE": EXERCISE, "TinyClassifier": TinyClassifier,
                 "consume_prefix_in_state_dict_if_present": consume_prefix_in_state_dict_if_present,
                 "check_gpu_checkpoint_on_cpu": lad.check_gpu_checkpoint_on_cpu, "display": shown.append}
    exec(cell(NB06, "code51"), namespace)
    assert len(shown) == 1 and shown[0], shown
    assert capsys.readouterr().out == "", "the solution's output is the verdict only (not the checkpoint's keys)"
    stub = lad.check_gpu_checkpoint_on_cpu(TinyClassifier(), EXERCISE, code=[cell(NB06, "code50")])
    rejected(stub, "none of the model's 4 tensors holds the checkpoint's values", "what copies a dict of weights",
             solution_bits=("load_state_dict(", "module."))
    # The stub loads nothing: its first message does not hand over the answer's key (the prefix); the closer
    # hint, asked for or after a second failure, names it.
    assert stub.message == ("none of the model's 4 tensors holds the checkpoint's values: it still has the random "
                            "weights it was built with."), stub.message
    assert "every key in the file starts with 'module.'" in stub.closer and "strict=False" not in stub.closer


def test_gpu_checkpoint_load_state_dict_called_but_nothing_loaded() -> None:
    """The code calls load_state_dict with the file's keys as they are: it raised, and the checker runs in the
    next cell. The prefix is this answer's mistake: the message names it."""
    code = ["clf = TinyClassifier()\nck = torch.load(EXERCISE, map_location='cpu')\n"
            "clf.load_state_dict(ck['state_dict'])",  # raised: the keys do not fit
            "check_gpu_checkpoint_on_cpu(clf, EXERCISE)"]
    verdict = lad.check_gpu_checkpoint_on_cpu(TinyClassifier(), EXERCISE, code=code)
    rejected(verdict, "although your code calls load_state_dict. Did that call raise", "read its error",
             solution_bits=("removeprefix", "consume_prefix"))
    assert "Every weight in the file is named 'module.…'" in verdict.message


def loaded_not_strict() -> TinyClassifier:
    clf = TinyClassifier()
    clf.load_state_dict(_weights(), strict=False)  # every key is 'module.…': nothing is loaded
    return clf


def test_gpu_checkpoint_strict_false_loads_nothing() -> None:
    code = ["clf = TinyClassifier()\nck = torch.load(EXERCISE, map_location='cpu')\n"
            "clf.load_state_dict(ck['state_dict'], strict=False)"]
    verdict = lad.check_gpu_checkpoint_on_cpu(loaded_not_strict(), EXERCISE, code=code)
    rejected(verdict, "load_state_dict(..., strict=False) loaded nothing", "what load_state_dict(..., strict=False) "
             "returns", solution_bits=("removeprefix", "consume_prefix"))
    assert "Every weight in the file is named 'module.…'" in verdict.message
    assert "torch.load only" not in verdict.hint  # the student did call load_state_dict
    # The whole checkpoint (epoch and state_dict) passed with strict=False: nothing loaded either.
    clf = TinyClassifier()
    clf.load_state_dict(torch.load(EXERCISE, map_location="cpu"), strict=False)
    rejected(lad.check_gpu_checkpoint_on_cpu(clf, EXERCISE, code=["clf.load_state_dict(ck, False)"]),
             "strict=False) loaded nothing", "missing and unexpected keys")
    # Outside a notebook the checker cannot see the code: the message says only what it sees (the initial
    # weights), and the closer hint names the prefix and the other possible cause.
    unseen = lad.check_gpu_checkpoint_on_cpu(loaded_not_strict(), EXERCISE)
    rejected(unseen, "it still has the random weights it was built with.", "what copies")
    assert "module." not in unseen.message and "strict=False" not in unseen.message, unseen.message
    assert "If you did call load_state_dict(..., strict=False): it skipped every key" in unseen.closer
    assert "every key in the file starts with 'module.'" in unseen.closer


def test_gpu_checkpoint_wrong_answers() -> None:
    check = lad.check_gpu_checkpoint_on_cpu
    rejected(check(torch.load(EXERCISE, map_location="cpu"), EXERCISE, code=[]), "you passed a dict",
             "torch.load only reads the file")
    helper = ["clf = TinyClassifier()\nclf = load_weights(clf, EXERCISE)"]
    rejected(check(load_weights(TinyClassifier(), EXERCISE), EXERCISE, code=helper),
             "your code calls load_weights from course_utils.checkpoints.loading", "Which steps does load_weights do")
    by_helpers = ["clf = TinyClassifier()\nclf.load_state_dict(checkpoints.strip_prefixes(load_checkpoint(EXERCISE)"
                  "['state_dict']))"]
    clf = TinyClassifier()
    clf.load_state_dict(strip_prefixes(load_checkpoint(EXERCISE)["state_dict"]))
    rejected(check(clf, EXERCISE, code=by_helpers), "calls load_checkpoint, strip_prefixes", "§1 names them")
    wrapped = nn.DataParallel(TinyClassifier())
    wrapped.load_state_dict(_weights())  # keys fit the wrapper
    rejected(check(wrapped, EXERCISE, code=[]), "you passed the DataParallel wrapper", "make the checkpoint's keys "
             "fit the model")
    halved = TinyClassifier()
    halved.load_state_dict({k.removeprefix("module."): v for k, v in _weights().items()})
    rejected(check(halved.half(), EXERCISE, code=[]), "the model's weights are torch.float16", "as they were saved",
             closer=False)
    part = TinyClassifier()
    part.load_state_dict({k.removeprefix("module."): v for k, v in _weights().items() if "hidden" in k},
                         strict=False)  # only the first layer's weights
    rejected(check(part, EXERCISE, code=["part.load_state_dict(fixed, strict=False)"]),
             "hidden.weight, hidden.bias hold the checkpoint's values, but out.weight, out.bias do not (strict=False",
             "Every key of the model must get its tensor")
    rejected(check(nn.Linear(4, 8), EXERCISE, code=[]), "the model's keys", "the class given", closer=False)


def right_weights(clf: nn.Module) -> nn.Module:
    clf.load_state_dict({k.removeprefix("module."): v for k, v in _weights().items()})
    return clf


def test_gpu_checkpoint_helper_hint_names_the_helper_used() -> None:
    """M4: the hint asks what the helper the answer used does, with the verb agreeing with their number."""
    check = lad.check_gpu_checkpoint_on_cpu
    clf = TinyClassifier()
    clf.load_state_dict(strip_prefixes(torch.load(EXERCISE, map_location="cpu")["state_dict"]))
    code = ["clf = TinyClassifier()\nck = torch.load(EXERCISE, map_location='cpu')\n"
            "clf.load_state_dict(strip_prefixes(ck['state_dict']))"]
    verdict = check(clf, EXERCISE, code=code)
    rejected(verdict, "your code calls strip_prefixes from course_utils.checkpoints.loading",
             "Which steps does strip_prefixes do for you?")
    assert "load_weights" not in verdict.hint and "strip_prefixes: what the keys look like" in verdict.hint
    assert "in place of strip_prefixes, a new dict whose keys lose DataParallel's prefix" in verdict.closer
    both = ["clf = TinyClassifier()\nclf.load_state_dict(strip_prefixes(load_checkpoint(EXERCISE)['state_dict']))"]
    verdict = check(right_weights(TinyClassifier()), EXERCISE, code=both)
    rejected(verdict, "calls load_checkpoint, strip_prefixes", "Which steps do load_checkpoint and strip_prefixes "
             "do for you?")
    assert "load_weights" not in verdict.hint and "load_checkpoint: where the tensors go" in verdict.hint


def test_gpu_checkpoint_weights_only_false_is_refused() -> None:
    """W10: weights_only=False loads this file too, but runs whatever code a pickle holds; a checkpoint of
    weights never needs it."""
    code = ["clf = TinyClassifier()\nck = torch.load(EXERCISE, map_location='cpu', weights_only=False)\n"
            "clf.load_state_dict({k.removeprefix('module.'): v for k, v in ck['state_dict'].items()})"]
    verdict = lad.check_gpu_checkpoint_on_cpu(right_weights(TinyClassifier()), EXERCISE, code=code)
    rejected(verdict, "torch.load(..., weights_only=False): that runs whatever code the file's pickle contains",
             "the safe default (weights_only=True)", solution_bits=("Leave weights_only out",))
    assert "Leave weights_only out" in verdict.closer
    for fine in ("weights_only=True", "weights_only=None"):  # the default, said out loud
        assert lad.check_gpu_checkpoint_on_cpu(right_weights(TinyClassifier()), EXERCISE,
                                               code=[code[0].replace("weights_only=False", fine)])


def test_gpu_checkpoint_the_model_must_stay_as_built() -> None:
    """W11: the right weights, then requires_grad_(False) or eval(): the model is not returned as built."""
    check = lad.check_gpu_checkpoint_on_cpu
    frozen = right_weights(TinyClassifier()).requires_grad_(False)
    rejected(check(frozen, EXERCISE, code=[]), "the weights are the checkpoint's, but the model is not as it was "
             "built: requires_grad is False for 4 of its 4 parameters (hidden.weight, hidden.bias, out.weight, "
             "out.bias)", "requires_grad")
    evaluating = right_weights(TinyClassifier()).eval()
    verdict = check(evaluating, EXERCISE, code=[])
    rejected(verdict, "it is in eval mode (model.training is False)", "training/eval mode")
    assert "requires_grad is False" not in verdict.message and "eval()" in verdict.closer
    one = right_weights(TinyClassifier())
    one.out.requires_grad_(False)
    one.hidden.eval()
    rejected(check(one, EXERCISE, code=[]), "requires_grad is False for 2 of its 4 parameters (out.weight, "
             "out.bias); and hidden is in eval mode", "caller decides")


def stepped(steps: int = 1, only: str | None = None) -> nn.Module:
    clf = right_weights(TinyClassifier())
    params = clf.parameters() if only is None else getattr(clf, only).parameters()
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        clf(torch.randn(8, 4)).pow(2).sum().backward()
        opt.step()
    return clf


def test_gpu_checkpoint_weights_changed_after_loading() -> None:
    """M2: loaded right, then an optimizer step: the tensors are neither the checkpoint's nor the ones the model
    was built with (their version counters show they were written since): something changed them."""
    check = lad.check_gpu_checkpoint_on_cpu
    code = ["clf = TinyClassifier()\nck = torch.load(EXERCISE, map_location='cpu')\n"
            "clf.load_state_dict({k.removeprefix('module.'): v for k, v in ck['state_dict'].items()})\n"
            "opt = torch.optim.SGD(clf.parameters(), lr=0.1)\nclf(torch.randn(8, 4)).sum().backward()\nopt.step()"]
    for answer, seen in ((stepped, code), (stepped, None), (lambda: stepped(steps=50), code)):
        verdict = check(answer(), EXERCISE, code=seen)
        rejected(verdict, "none of the model's 4 tensors holds the checkpoint's values, and they are not the random "
                 "values the model was built with either: something changed the weights after loading",
                 "What ran on the model between loading and the check?")
        assert "still has the random weights" not in verdict.message and "module." not in verdict.message
    in_place = right_weights(TinyClassifier())
    with torch.no_grad():
        in_place.out.weight.mul_(2)  # one tensor changed after loading
    rejected(check(in_place, EXERCISE, code=[]), "hidden.weight, hidden.bias, out.bias hold the checkpoint's "
             "values, but out.weight was changed after loading", "look at what ran on the model")
    rejected(check(stepped(only="out"), EXERCISE, code=[]), "hidden.weight, hidden.bias hold the checkpoint's "
             "values, but out.weight, out.bias were changed after loading", "look at what ran")
    never_loaded = TinyClassifier()  # nothing loaded, and a step on one layer
    opt = torch.optim.SGD(never_loaded.out.parameters(), lr=0.1)
    never_loaded(torch.randn(8, 4)).sum().backward()
    opt.step()
    rejected(check(never_loaded, EXERCISE, code=[]), "none of the model's 4 tensors holds the checkpoint's values: "
             "out.weight, out.bias were written since the model was built (a training step, an in-place operation?), "
             "and hidden.weight, hidden.bias still have the random values it was built with.", "What ran on the model")


def test_gpu_checkpoint_partial_load_agrees_in_number() -> None:
    """M4's grammar: one tensor holds, one does not; several hold, several do not."""
    clf = TinyClassifier()
    weights = {k.removeprefix("module."): v for k, v in _weights().items()}
    clf.load_state_dict({k: v for k, v in weights.items() if k != "hidden.weight"}, strict=False)
    rejected(lad.check_gpu_checkpoint_on_cpu(clf, EXERCISE, code=["clf.load_state_dict(part, strict=False)"]),
             "hidden.bias, out.weight, out.bias hold the checkpoint's values, but hidden.weight does not "
             "(strict=False skipped them)", "Every key of the model must get its tensor")
    clf = TinyClassifier()
    clf.load_state_dict({"hidden.bias": weights["hidden.bias"]}, strict=False)
    rejected(lad.check_gpu_checkpoint_on_cpu(clf, EXERCISE, code=[]),
             "hidden.bias holds the checkpoint's values, but hidden.weight, out.weight, out.bias do not.",
             "Every key of the model must get its tensor")


def right_by_comprehension() -> nn.Module:
    clf = TinyClassifier()
    checkpoint = torch.load(EXERCISE, map_location=torch.device("cpu"))
    clf.load_state_dict({key.removeprefix("module."): value for key, value in checkpoint["state_dict"].items()})
    return clf


def right_through_the_wrapper() -> nn.Module:
    clf = TinyClassifier()
    nn.DataParallel(clf).load_state_dict(torch.load(EXERCISE, map_location="cpu")["state_dict"])
    return clf  # the plain model, loaded through its wrapper


def right_with_assign() -> nn.Module:
    clf = TinyClassifier()
    weights = torch.load(EXERCISE, map_location=lambda storage, loc: storage)["state_dict"]
    clf.load_state_dict({k[len("module."):]: v for k, v in weights.items()}, assign=True)
    return clf


def right_strict_false_after_fixing() -> nn.Module:
    clf = TinyClassifier()
    weights = torch.load(EXERCISE, map_location={"cuda:0": "cpu"})["state_dict"]
    consume_prefix_in_state_dict_if_present(weights, "module.")
    clf.load_state_dict(weights, strict=False)  # every key fits: strict=False skips nothing
    return clf


def right_copy_by_hand() -> nn.Module:
    clf = TinyClassifier()
    weights = torch.load(EXERCISE, map_location="cpu")["state_dict"]
    with torch.no_grad():
        for name, param in clf.named_parameters():
            param.copy_(weights["module." + name])
    return clf


@pytest.mark.parametrize("build", [right_by_comprehension, right_through_the_wrapper, right_with_assign,
                                   right_strict_false_after_fixing, right_copy_by_hand])
def test_gpu_checkpoint_right_answers_written_differently(build: Callable[[], nn.Module]) -> None:
    code = [inspect.getsource(build)]  # what the checker reads in a notebook: no helper, no strict=False slip
    assert lad.check_gpu_checkpoint_on_cpu(build(), EXERCISE, code=code)


def test_gpu_checkpoint_reads_the_cells_run_since_the_model_was_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a notebook the checker reads the cells from the one that built the model on: a helper used there is
    seen, one used by the lesson before is not. The shell is this test's own (IPython's global test shell can be
    started only once per process, and tests/test_exercise_hints.py starts it)."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell(config=config)
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    shell.user_ns.update(torch=torch, TinyClassifier=TinyClassifier, EXERCISE=EXERCISE, load_weights=load_weights,
                         load_checkpoint=load_checkpoint, check=lad.check_gpu_checkpoint_on_cpu)
    cells = ["lesson = load_checkpoint(EXERCISE)  # the lesson's own use, before the exercise",
             "clf = TinyClassifier()",
             "ck = torch.load(EXERCISE, map_location='cpu')\n"
             "clf.load_state_dict({k.removeprefix('module.'): v for k, v in ck['state_dict'].items()})",
             "first = check(clf, EXERCISE)",
             "clf = TinyClassifier()\nclf = load_weights(clf, EXERCISE)\nsecond = check(clf, EXERCISE)",
             "clf = TinyClassifier()\nclf.load_state_dict(ck['state_dict'], strict=False)",
             "third = check(clf, EXERCISE)"]
    for source in cells:
        result = shell.run_cell(source, store_history=True)
        assert result.success, result.error_in_exec
    assert shell.user_ns["first"], shell.user_ns["first"]
    rejected(shell.user_ns["second"], "your code calls load_weights", "Which steps")
    third = shell.user_ns["third"]  # the second failure in this "kernel": the closer hint comes with it
    assert not third and "load_state_dict(..., strict=False) loaded nothing" in third.message
    assert f"Closer hint: {third.closer}" in str(third)
    assert lad._answer_cells(TinyClassifier()) is None  # called from a test, not from a cell


# ================================================================ 06, exercise 2: two prefixes

def _two_part() -> nn.Module:
    namespace: dict[str, Any] = {"nn": nn}
    exec(cell_defs(NB06, "code53", "TwoPart"), namespace)
    return namespace["TwoPart"]()


def repair_stub(state_dict):  # type: ignore[no-untyped-def]
    namespace: dict[str, Any] = {}
    exec(cell_defs(NB06, "code53", "repair"), namespace)
    return namespace["repair"](state_dict)


def module_only(sd):  # type: ignore[no-untyped-def]
    return {k.removeprefix("module."): v for k, v in sd.items()}


def str_replace(sd):  # type: ignore[no-untyped-def]
    return {k.replace("module.", "").replace("_orig_mod.", ""): v for k, v in sd.items()}


def fixed_slice(sd):  # type: ignore[no-untyped-def]  # len("module._orig_mod."): right for `broken` only
    return {k[17:]: v for k, v in sd.items()}


def split_twice(sd):  # type: ignore[no-untyped-def]  # two dots, two prefixes: right for `broken` only
    return {k.split(".", 2)[2]: v for k, v in sd.items()}


def one_pass(sd):  # type: ignore[no-untyped-def]  # one order: not the other
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in sd.items()}


def names_by_hand(sd):  # type: ignore[no-untyped-def]  # the keys of `broken`, written out
    return {name: sd["module._orig_mod." + name]
            for name in ("encoder.weight", "encoder.bias", "submodule.weight", "submodule.bias")}


def consume_in_place(sd):  # type: ignore[no-untyped-def]
    consume_prefix_in_state_dict_if_present(sd, "module.")
    consume_prefix_in_state_dict_if_present(sd, "_orig_mod.")
    return sd


def pop_while_building(sd):  # type: ignore[no-untyped-def]
    fixed = {}
    for key in list(sd):
        fixed[re.sub(r"^(module\.|_orig_mod\.)+", "", key)] = sd.pop(key)
    return fixed


def forgot_return(sd):  # type: ignore[no-untyped-def]
    {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in sd.items()}  # noqa: B018


def drops_biases(sd):  # type: ignore[no-untyped-def]
    return {k: v for k, v in strip_prefixes(sd).items() if k.endswith("weight")}


def zeroed_values(sd):  # type: ignore[no-untyped-def]
    return {k: torch.zeros_like(v) for k, v in strip_prefixes(sd).items()}


@pytest.mark.parametrize(("fn", "message", "hint"), [
    (repair_stub, "still start with a wrapper prefix, e.g. 'module._orig_mod.encoder.weight'", "How many wrappers"),
    (module_only, "still start with a wrapper prefix, e.g. '_orig_mod.encoder.weight'", "How many wrappers"),
    (str_replace, "keys that the model does not have: ['subweight', 'subbias']", "the str.replace pitfall"),
    (fixed_slice, "but not for the state_dict of a model wrapped in DataParallel or DDP only", "fixed number of"),
    (split_twice, "but not for the state_dict of a model wrapped in DataParallel or DDP only", "not a fixed sequence"),
    (one_pass, "'_orig_mod.module.encoder.weight': some keys still start with a wrapper prefix", "either order"),
    (names_by_hand, "your function raised KeyError", "remove the prefixes that are there"),
    (consume_in_place, "changed the dict it was given: its keys are now ['encoder.weight'", "work in place"),
    (pop_while_building, "changed the dict it was given: its keys are now []", "a new dict"),
    (forgot_return, "returned None", "must return it"),
    (drops_biases, "keys missing from your dict: ['encoder.bias', 'submodule.bias']", "Keep every entry"),
    (zeroed_values, "encoder.weight does not hold the same tensor", "not the values"),
])
def test_two_prefix_wrong_answers(fn: Callable[..., Any], message: str, hint: str) -> None:
    rejected(lad.check_two_prefix_repair(fn, _two_part()), message, hint, solution_bits=("removeprefix(",),
             closer=fn not in (drops_biases, zeroed_values))


def by_regex(sd):  # type: ignore[no-untyped-def]
    return OrderedDict((re.sub(r"^(?:module\.|_orig_mod\.)+", "", k), v) for k, v in sd.items())


def consume_a_copy(sd):  # type: ignore[no-untyped-def]
    copy = OrderedDict(sd)
    for prefix in ("module.", "_orig_mod.", "module."):
        consume_prefix_in_state_dict_if_present(copy, prefix)
    return copy


def recursive(sd):  # type: ignore[no-untyped-def]
    def clean(key: str) -> str:
        for prefix in ("module.", "_orig_mod."):
            if key.startswith(prefix):
                return clean(key[len(prefix):])
        return key
    return {clean(k): v.clone() for k, v in sd.items()}  # copies of the values are the same tensors


@pytest.mark.parametrize("fn", [by_regex, consume_a_copy, recursive, strip_prefixes,
                                notebook_solution(NB06, "repair")])
def test_two_prefix_right_answers(fn: Callable[..., Any]) -> None:
    assert lad.check_two_prefix_repair(fn, _two_part())


def shallow_copy_then_consume(sd):  # type: ignore[no-untyped-def]  # W13: copy.copy shares _metadata
    sd = copy.copy(sd)
    for prefix in ("module.", "_orig_mod.", "module."):
        consume_prefix_in_state_dict_if_present(sd, prefix)
    return sd


def last_two_parts(sd):  # type: ignore[no-untyped-def]  # W14: right for TwoPart's keys of two parts
    return {".".join(k.split(".")[-2:]): v for k, v in sd.items()}


def drops_wrapper_parts_anywhere(sd):  # type: ignore[no-untyped-def]  # W15: 'submodule' is safe, 'module' is not
    return {".".join(p for p in k.split(".") if p not in ("module", "_orig_mod")): v for k, v in sd.items()}


def as_double(sd):  # type: ignore[no-untyped-def]  # W16: torch.equal compares values across dtypes
    return {k: v.double() for k, v in strip_prefixes(sd).items()}


def to_meta(sd):  # type: ignore[no-untyped-def]  # C1: torch.equal raises on meta tensors
    return {k: v.to("meta") for k, v in strip_prefixes(sd).items()}


def with_the_epoch(sd):  # type: ignore[no-untyped-def]  # M3: an extra key, not a badly cut one
    return {**strip_prefixes(sd), "epoch": 3}


@pytest.mark.parametrize(("fn", "message", "hint"), [
    (shallow_copy_then_consume, "changed the dict it was given: not its entries, but its _metadata (the module "
     "versions that load_state_dict reads), whose keys are now ['', 'encoder', 'submodule']; they were ['', "
     "'module', 'module._orig_mod']", "does your copy have its own, or share the argument's?"),
    (last_two_parts, "right for TwoPart, but not for a deeper model, saved from a compiled model wrapped in "
     "DataParallel, whose own block keeps its layer in an attribute named `module`, "
     "with keys like 'module._orig_mod.block.module.weight': keys that the model does not have: ['0.weight', "
     "'0.bias', 'module.weight']", "a model's own layer can be called `module` too"),
    (drops_wrapper_parts_anywhere, "with keys like 'module._orig_mod.block.module.weight': keys that the model "
     "does not have: ['block.weight', 'block.bias']", "Remove the wrappers' prefixes from the start"),
    (as_double, "encoder.weight does not hold the same tensor as the state_dict it came from: it is torch.float64, "
     "the state_dict's is torch.float32", "not the values"),
    (to_meta, "encoder.weight does not hold the same tensor as the state_dict it came from: it is on meta, the "
     "state_dict's is on cpu", "not the values"),
    (with_the_epoch, "your dict has every key of the model, and more that it does not have: ['epoch']",
     "holds the model's weights and nothing else"),
])
def test_two_prefix_wrong_answers_found_in_a_class(fn: Callable[..., Any], message: str, hint: str) -> None:
    verdict = lad.check_two_prefix_repair(fn, _two_part())
    rejected(verdict, message, hint, solution_bits=("removeprefix(",))
    assert "str.replace" not in verdict.hint


def test_two_prefix_the_deeper_model_loads_what_its_wrappers_save() -> None:
    """The deeper model's state_dicts, as the checker writes them, are those of the real wrappers: keys and
    _metadata; and the right answers fit them."""
    real = {"module._orig_mod.": nn.DataParallel(torch.compile(lad.Deeper())),
            "_orig_mod.module.": torch.compile(nn.DataParallel(lad.Deeper())),
            "module.": nn.DataParallel(lad.Deeper()), "_orig_mod.": torch.compile(lad.Deeper()), "": lad.Deeper()}
    for prefix, wrapped in real.items():
        saved, written = wrapped.state_dict(), lad._prefixed(lad.Deeper(), prefix)
        assert list(saved) == list(written) and saved._metadata == written._metadata  # type: ignore[attr-defined]
        assert "block.module.weight" in strip_prefixes(saved)  # its own `module` stays
        lad.Deeper().load_state_dict(strip_prefixes(saved))


def copy_deep_then_consume(sd):  # type: ignore[no-untyped-def]  # a deep copy has its own _metadata
    sd = copy.deepcopy(sd)
    for prefix in ("module.", "_orig_mod.", "module."):
        consume_prefix_in_state_dict_if_present(sd, prefix)
    return sd


def new_dict_then_consume(sd):  # type: ignore[no-untyped-def]  # sd.copy() takes the entries only
    sd = sd.copy()
    for prefix in ("_orig_mod.", "module.", "_orig_mod."):
        consume_prefix_in_state_dict_if_present(sd, prefix)
    return sd


def partition_loop(sd):  # type: ignore[no-untyped-def]
    out = {}
    for key, value in sd.items():
        head, dot, rest = key.partition(".")
        while dot and head in ("module", "_orig_mod"):
            key = rest
            head, dot, rest = key.partition(".")
        out[key] = value
    return out


@pytest.mark.parametrize("fn", [copy_deep_then_consume, new_dict_then_consume, partition_loop])
def test_two_prefix_right_answers_of_the_same_class(fn: Callable[..., Any]) -> None:
    verdict = lad.check_two_prefix_repair(fn, _two_part())
    assert verdict, verdict
    assert "a deeper model with a layer of its own called `module`" in verdict.message


def test_two_prefix_not_a_function() -> None:
    rejected(lad.check_two_prefix_repair(strip_prefixes(_two_part().state_dict()), _two_part()),  # type: ignore[arg-type]
             "expected your function repair", "the function itself", closer=False)



# ================================================================ 06, the checkers themselves

def test_gpu_checkpoint_checker_right_and_wrong(original_course):
    path = original_course / "l30_model_in_multi_gpu.pkl"
    right = load_weights(FooNet(), path)
    assert check_gpu_checkpoint_on_cpu(right, path)
    verdict = check_gpu_checkpoint_on_cpu(FooNet(), path)  # forgot load_state_dict
    assert not verdict and "still has the random weights it was built with" in verdict.message
    assert not check_gpu_checkpoint_on_cpu(load_checkpoint(path), path)  # the dict, not the model
    assert "DataParallel wrapper" in check_gpu_checkpoint_on_cpu(nn.DataParallel(right), path).message
    assert not check_gpu_checkpoint_on_cpu(nn.Linear(3, 3), path)
    assert not check_gpu_checkpoint_on_cpu(right, path.with_name("missing.pkl"))


def test_gpu_checkpoint_checker_after_loading(saved):
    """The weights loaded, then changed by a training step, or the model frozen: both rejected for what they did."""
    stepped = load_weights(FooNet(), saved)
    opt = torch.optim.SGD(stepped.parameters(), lr=0.1)
    stepped(torch.randn(4, 3)).sum().backward()
    opt.step()
    verdict = check_gpu_checkpoint_on_cpu(stepped, saved)
    assert not verdict and "something changed the weights after loading" in verdict.message, verdict
    assert "still has the random weights" not in verdict.message
    verdict = check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved).requires_grad_(False), saved)
    assert not verdict and "requires_grad is False for 3 of its 3 parameters" in verdict.message, verdict
    verdict = check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved).eval(), saved)
    assert not verdict and "eval mode" in verdict.message, verdict


def test_gpu_checkpoint_checker_needs_no_fixture(saved):
    assert check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved), saved)
    assert "you passed a dict" not in check_gpu_checkpoint_on_cpu(FooNet(), saved).message
    assert "cannot read the checkpoint" in check_gpu_checkpoint_on_cpu(FooNet(), saved.with_name("gone.pt")).message


def test_two_prefix_checker_tries_the_prefixes_the_wrappers_really_add():
    """The checker writes its state_dicts' prefixes by hand: they are those of the real wrappers."""
    from course_utils.exercises.loading_across_devices import _CASES

    real = {
        "module._orig_mod.": nn.DataParallel(torch.compile(_two_part())),  # the notebook's `broken`
        "_orig_mod.module.": torch.compile(nn.DataParallel(_two_part())),  # what torch.compile(ddp_model) saves
        "module.": nn.DataParallel(_two_part()),
        "_orig_mod.": torch.compile(_two_part()),
        "": _two_part(),
    }
    from course_utils.exercises.loading_across_devices import _prefixed

    assert [prefix for prefix, _ in _CASES] == list(real)
    for prefix, wrapped in real.items():
        assert list(wrapped.state_dict()) == [prefix + k for k in _two_part().state_dict()]
        # and the version metadata that a real state_dict carries, the wrappers' own entries included
        assert wrapped.state_dict()._metadata == _prefixed(_two_part(), prefix)._metadata
    assert check_two_prefix_repair(strip_prefixes, _two_part())


def test_two_prefix_checker_wrong_answers():
    def none(state_dict):
        return None

    def one(state_dict):
        return {k.removeprefix("module."): v for k, v in state_dict.items()}

    def replaced(state_dict):
        return {k.replace("module.", "").replace("_orig_mod.", ""): v for k, v in state_dict.items()}

    def fewer(state_dict):
        return dict(list(strip_prefixes(state_dict).items())[:2])

    def changed(state_dict):
        return {k: torch.zeros_like(v) for k, v in strip_prefixes(state_dict).items()}

    def in_place(state_dict):
        repaired = strip_prefixes(state_dict)
        state_dict.clear()
        state_dict.update(repaired)  # the student changed `broken` itself
        return state_dict

    assert "returned None" in check_two_prefix_repair(none, _two_part()).message
    assert "expected a dict of weights" in check_two_prefix_repair(lambda sd: [1], _two_part()).message
    assert "still start with a wrapper prefix" in check_two_prefix_repair(one, _two_part()).message
    verdict = check_two_prefix_repair(replaced, _two_part())
    assert not verdict and "str.replace pitfall" in verdict.hint and "removeprefix" in verdict.closer
    assert "missing" in check_two_prefix_repair(fewer, _two_part()).message
    assert "same tensor" in check_two_prefix_repair(changed, _two_part()).message
    assert "changed the dict it was given" in check_two_prefix_repair(in_place, _two_part()).message

    import copy

    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    def shallow_copy(state_dict):
        state_dict = copy.copy(state_dict)  # shares _metadata with the argument
        for prefix in ("module.", "_orig_mod.", "module."):
            consume_prefix_in_state_dict_if_present(state_dict, prefix)
        return state_dict

    def last_parts(state_dict):
        return {".".join(k.split(".")[-2:]): v for k, v in state_dict.items()}

    assert "its _metadata" in check_two_prefix_repair(shallow_copy, _two_part()).message
    assert "a deeper model" in check_two_prefix_repair(last_parts, _two_part()).message
    assert "torch.float64" in check_two_prefix_repair(
        lambda sd: {k: v.double() for k, v in strip_prefixes(sd).items()}, _two_part()).message
    assert "on meta" in check_two_prefix_repair(
        lambda sd: {k: v.to("meta") for k, v in strip_prefixes(sd).items()}, _two_part()).message
    assert "more that it does not have: ['epoch']" in check_two_prefix_repair(
        lambda sd: {**strip_prefixes(sd), "epoch": 1}, _two_part()).message
