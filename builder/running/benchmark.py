"""`moe-stack bench`: prefill and decode speed of a running stack, with exactly its engine flags, and
its decode against the memory bandwidth bound read inside the engine's container.

The engine's own `/completion` endpoint reports its timings (prompt and predicted tokens per second),
so the figures are the server's, not the HTTP round trip's. Prompt caching is off, so every
repetition processes the whole prompt.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from builder.errors import StackError
from builder.running.api import EngineApi
from builder.running.bandwidth import ARRAY_MIB, TOOL, DecodeBound, parse_bandwidth
from builder.running.run import run_in_service
from builder.stackfile.service_parts import engine_service_name
from builder.stackfile.stack_file import StackFile

# A sentence of ordinary words: about one token per word in every tokenizer moe-stack serves.
_FILLER = "the quick brown fox jumps over the lazy dog while the river runs past the old mill "


@dataclass(frozen=True)
class Speed:
    prompt_tokens: int
    generated_tokens: int
    prefill_tps: list[float]
    decode_tps: list[float]

    @property
    def prefill(self) -> float:
        return statistics.median(self.prefill_tps)

    @property
    def decode(self) -> float:
        return statistics.median(self.decode_tps)


def measure(
    port: int,
    prompt_words: int = 256,
    generate: int = 64,
    repetitions: int = 3,
    host: str = "127.0.0.1",
    api_key: str | None = None,
) -> Speed:
    """Time `repetitions` completions of a `prompt_words`-word prompt generating `generate` tokens."""
    words = _FILLER.split()
    prompt = " ".join(words[i % len(words)] for i in range(prompt_words))
    prefill, decode, n_prompt, n_gen = [], [], 0, 0
    for _ in range(repetitions):
        body = {
            "prompt": prompt,
            "n_predict": generate,
            "temperature": 0,
            "cache_prompt": False,
            "ignore_eos": True,
        }
        timings = EngineApi(port, host, api_key, timeout_s=600).post("/completion", body).get("timings") or {}
        if not timings.get("prompt_per_second") or not timings.get("predicted_per_second"):
            raise StackError(
                f"the engine on port {port} reported no timings; is it a llama.cpp-family server?"
            )
        prefill.append(float(timings["prompt_per_second"]))
        decode.append(float(timings["predicted_per_second"]))
        n_prompt, n_gen = int(timings.get("prompt_n", 0)), int(timings.get("predicted_n", 0))
    return Speed(prompt_tokens=n_prompt, generated_tokens=n_gen, prefill_tps=prefill, decode_tps=decode)


def running_bound(compose_file: Path, profile: str | None) -> DecodeBound | str:
    """The decode bound of a running one-model stack: moe-stack-bandwidth run inside its engine's
    container (on the CPUs and memory the engine has), and the bytes its model reads per token; or why
    there is none."""
    stack = StackFile.read(compose_file)
    name = engine_service_name(profile)
    served = stack.record.serves.get(name)
    if served is None or stack.record.models:
        return "the file records no single model it serves"
    try:
        bandwidth = parse_bandwidth(run_in_service(compose_file, name, profile, [TOOL, str(ARRAY_MIB)]))
    except StackError as err:
        return str(err)
    if bandwidth is None:
        return f"{TOOL} printed no read rate"
    hybrid = served.gpu_layers not in (None, 0)
    facts = stack.record.engine.model_format.facts(stack.record.model)
    return DecodeBound(bandwidth=bandwidth, bytes_per_token=facts.read_per_token(hybrid), hybrid=hybrid)
