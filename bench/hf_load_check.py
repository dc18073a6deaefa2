"""Load `moe-stack synth-moe --format hf` checkpoints with transformers' own model classes: every weight
the class declares is in the file and nothing else is (no missing, unexpected or mismatched keys), and
a greedy generation of a few tokens runs. `python3 hf_load_check.py DIR [DIR ...]` (needs torch and
transformers); prints one JSON line per checkpoint and exits 1 when any failed.

The names and shapes SGLang's loaders map from are the released checkpoints', which transformers' classes
declare. Run on the tiny checkpoints of each architecture (`synth-moe --arch A --tiny --format hf`) in a
scratch environment with torch's CPU wheel: bench/results/kt-seed-models-2026-12-02/hf-load-check.txt.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def check(directory: str) -> dict[str, object]:
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )
    problems = {key: sorted(map(str, value))[:8] for key, value in info.items() if value}
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = prompt if isinstance(prompt, torch.Tensor) else prompt["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    return {
        "checkpoint": directory,
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loading_problems": problems,
        "generated_tokens": int(out.shape[-1] - ids.shape[-1]),
        "ok": not problems and out.shape[-1] > ids.shape[-1],
    }


def main(directories: list[str]) -> int:
    failed = 0
    for directory in directories:
        result = check(directory)
        failed += not result["ok"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
