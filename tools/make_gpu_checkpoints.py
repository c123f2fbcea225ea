#!/usr/bin/env python3
"""Save the small, real GPU checkpoints that notebook 06 loads on CPU-only machines.

Run it on a CUDA host, from the repository root:

    python3 tools/make_gpu_checkpoints.py            # writes notebooks/data/06_*.pt and 06_checkpoints.json
    python3 tools/make_gpu_checkpoints.py --out DIR  # somewhere else

It refuses to run without a CUDA GPU: the point of these files is that their tensors really were on
``cuda:0`` when they were saved, so that a student without a GPU meets the real error and fixes it.
Weights are drawn on the CPU with fixed seeds and then moved, so the values are the same on every host.
Each file is a few KB. After running it: commit the files, then `make refresh` re-executes notebook 06.

Files written:
    06_foonet_cuda0.pt           FooNet's state_dict, saved from cuda:0
    06_foonet_dataparallel.pt    the same net inside nn.DataParallel: keys start with "module."
    06_foonet_compiled.pt        the same net after torch.compile: keys start with "_orig_mod."
    06_foonet_training_cuda0.pt  a training checkpoint: epoch, loss, model_state_dict, and the
                                 optimizer_state_dict of Adam after 5 steps on cuda:0 (moments on the GPU)
    06_exercise_classifier.pt    the exercise: {"epoch", "state_dict"} of a DataParallel TinyClassifier
    06_checkpoints.json          provenance: GPU, PyTorch and CUDA versions, date, file sizes and sha256
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_utils.models import FooNet, TinyClassifier  # noqa: E402  (the classes notebook 06 uses)


def training_data() -> tuple[torch.Tensor, torch.Tensor]:
    """The batch the training checkpoint was trained on (notebook 06 draws the same one)."""
    g = torch.Generator().manual_seed(6)
    return torch.randn(16, 3, generator=g), torch.rand(16, 3, generator=g)


def seeded(cls: type[nn.Module], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return cls()  # initialised on the CPU, so the weights do not depend on the GPU


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "notebooks" / "data")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("make_gpu_checkpoints.py needs a CUDA GPU, and none is visible here. These checkpoints must "
                 "really be saved from a GPU; run this script on a GPU host.")
    dev = torch.device("cuda", 0)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, nn.Module | dict] = {}

    net = seeded(FooNet, 0).to(dev)
    written["06_foonet_cuda0.pt"] = net.state_dict()

    dp = nn.DataParallel(seeded(FooNet, 0).to(dev), device_ids=[0])
    written["06_foonet_dataparallel.pt"] = dp.state_dict()

    compiled = torch.compile(seeded(FooNet, 0).to(dev))  # not run: the wrapper alone adds "_orig_mod."
    written["06_foonet_compiled.pt"] = compiled.state_dict()

    model = seeded(FooNet, 1).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = (t.to(dev) for t in training_data())
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    written["06_foonet_training_cuda0.pt"] = {
        "epoch": 5, "loss": round(loss.item(), 6),
        "model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
    }

    clf = nn.DataParallel(seeded(TinyClassifier, 3).to(dev), device_ids=[0])
    written["06_exercise_classifier.pt"] = {"epoch": 3, "state_dict": clf.state_dict()}

    files = {}
    for name, obj in written.items():
        path = out / name
        torch.save(obj, path)
        torch.load(path, weights_only=True)  # every file must load with the safe loader
        data = path.read_bytes()
        files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({len(data)} bytes)")
    meta = {
        "made_by": "tools/make_gpu_checkpoints.py",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.now(timezone.utc).date().isoformat(),
        "files": files,
    }
    (out / "06_checkpoints.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(f"wrote 06_checkpoints.json: saved on {meta['device']}, PyTorch {meta['torch']}, CUDA {meta['cuda']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
