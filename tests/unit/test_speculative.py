"""Speculative decoding's options: written in each engine's syntax against its recorded flag contract,
refused in one line where they can't work (checked on real GGUFs written by synth-moe), and counted by
the VRAM plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.engines.compute_buffers import gpu_compute
from builder.errors import ModelError, SpecError, StackError
from builder.features.speculative import checked_speculative, draft_vram_bytes
from builder.images.recorded_contracts import recorded_contract
from builder.models.gguf_facts import read_facts
from builder.models.kv_cache import CacheLayout, kv_cache_bytes
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import shape_facts, write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES, DeepSeek2Shape, Tensor
from builder.spec import EngineOptions

QWEN = TINY_SHAPES["qwen3moe"]
from tests.specs import opened


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("spec")
    return {
        "model": write_moe_gguf(directory / "m.gguf", QWEN),
        "draft": write_moe_gguf(directory / "d.gguf", dataclasses.replace(QWEN, layers=1), seed=3),
        "wide": write_moe_gguf(directory / "wide.gguf", dataclasses.replace(QWEN, layers=1, vocab=1024)),
        "mtp": write_moe_gguf(
            directory / "r1.gguf", dataclasses.replace(TINY_SHAPES["deepseek2"], mtp_layers=1)
        ),
    }


def _args(engine: str, model: Path, gpu: str = "none", **options: object) -> list[str]:
    stack = StackSpec(
        project_name="p", engine=engine, image_ref="i:1", model=model, cpu_threads=2, gpu=gpu, **options
    )  # type: ignore[arg-type]
    contract = recorded_contract(get_engine(engine))
    assert contract is not None
    return get_engine(engine).server_args(stack, contract.flags)


def test_each_engine_writes_a_draft_in_its_own_syntax(ggufs: dict[str, Path]) -> None:
    mainline = _args("llama.cpp", ggufs["model"], "nvidia", draft_model=ggufs["draft"], draft_max=4)
    # The pinned server lists --draft-max in --help and rejects it ("the argument has been removed").
    assert "--draft-max" not in mainline
    assert mainline[mainline.index("--model-draft") :][:8] == [
        "--model-draft",
        "/models/d.gguf",
        "--spec-type",
        "draft-simple",
        "--n-gpu-layers-draft",
        "99",
        "--spec-draft-n-max",
        "4",
    ]
    # ik's pinned server drafts only in a --spec-type stage, which holds the length (--draft-max exits).
    ik = _args("ik_llama.cpp", ggufs["model"], draft_model=ggufs["draft"], draft_max=4)
    assert ik[ik.index("--model-draft") :][:4] == [
        "--model-draft",
        "/models/d.gguf",
        "--spec-type",
        "draft:n_max=4",
    ]
    assert "--n-gpu-layers-draft" not in ik and "--draft-max" not in ik  # a CPU stack
    ik_default = _args("ik_llama.cpp", ggufs["model"], "nvidia", draft_model=ggufs["draft"])
    assert ik_default[ik_default.index("--model-draft") :][:6] == [
        "--model-draft",
        "/models/d.gguf",
        "--n-gpu-layers-draft",
        "99",
        "--spec-type",
        "draft",
    ]
    # A build whose --spec-type takes no stage (55d3c05's) drafts with --draft-max.
    contract = recorded_contract(get_engine("ik_llama.cpp"))
    assert contract is not None
    older = {**contract.flags, "--spec-type": "Name [none | ngram - cache | ngram - simple]"}
    stack = StackSpec(
        project_name="p", engine="ik_llama.cpp", image_ref="i:1", model=ggufs["model"], cpu_threads=2
    )
    drafting = stack.model_copy(update={"draft_model": ggufs["draft"], "draft_max": 4})
    old_args = get_engine("ik_llama.cpp").server_args(drafting, older)
    assert old_args[old_args.index("--model-draft") :][:4] == [
        "--model-draft",
        "/models/d.gguf",
        "--draft-max",
        "4",
    ]
    mtp = _args("llama.cpp", ggufs["mtp"], mtp=True)
    assert mtp[mtp.index("--spec-type") + 1] == "draft-mtp"


def test_an_older_mainline_without_the_new_spellings_gets_the_old_or_a_refusal(
    ggufs: dict[str, Path],
) -> None:
    contract = recorded_contract(get_engine("llama.cpp"))
    assert contract is not None
    older = {k: v for k, v in contract.flags.items() if not k.startswith("--spec-draft")}
    older["--spec-type"] = "none,ngram-cache"
    stack = StackSpec(
        project_name="p", engine="llama.cpp", image_ref="i:1", model=ggufs["model"], cpu_threads=2
    )
    adapter = get_engine("llama.cpp")
    assert adapter.draft_max_flag(older) == "--draft-max"  # type: ignore[attr-defined]
    with pytest.raises(StackError, match="no --spec-type draft-mtp; drop --mtp"):
        adapter.server_args(stack.model_copy(update={"mtp": True}), older)


def test_ik_refuses_mtp_and_a_file_that_carries_the_layer(ggufs: dict[str, Path]) -> None:
    with pytest.raises(StackError, match="doesn't draft with ik_llama.cpp's MTP stage yet; drop --mtp"):
        _args("ik_llama.cpp", ggufs["model"], mtp=True)
    with pytest.raises(StackError, match="r1.gguf: its deepseek2 multi-token-prediction layer"):
        get_engine("ik_llama.cpp").check_layout(opened(ggufs["mtp"], "ik_llama.cpp"))
    get_engine("ik_llama.cpp").check_layout(opened(ggufs["model"], "ik_llama.cpp"))
    get_engine("llama.cpp").check_layout(opened(ggufs["mtp"], "llama.cpp"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"draft_model": "d.gguf", "mtp": True}, "--draft-model and --mtp are two ways"),
        ({"draft_max": 4}, "--draft-max sets how many tokens a draft proposes"),
        ({"mtp": True}, "m.gguf carries no multi-token-prediction layer"),
        ({"draft_model": "wide.gguf"}, "wide.gguf has 1024 tokens and m.gguf 341"),
    ],
)
def test_a_draft_that_cannot_work_is_refused_in_one_line(
    ggufs: dict[str, Path], options: dict[str, object], message: str
) -> None:
    given = {k: ggufs["model"].parent / v if k == "draft_model" else v for k, v in options.items()}
    with pytest.raises(SpecError, match=message):
        checked_speculative(EngineOptions(**given), opened(ggufs["model"]), get_engine("llama.cpp"))  # type: ignore[arg-type]


def test_a_draft_elsewhere_than_the_models_directory_is_refused(
    ggufs: dict[str, Path], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "d.gguf"
    elsewhere.write_bytes(ggufs["draft"].read_bytes())
    with pytest.raises(
        SpecError, match="is not in the model's directory .* put it \\(or a link to it\\) there"
    ):
        checked_speculative(
            EngineOptions(draft_model=elsewhere), opened(ggufs["model"]), get_engine("llama.cpp")
        )


def test_the_plan_counts_the_draft_and_the_mtp_layer(ggufs: dict[str, Path]) -> None:
    adapter = get_engine("llama.cpp")
    options, draft = checked_speculative(
        EngineOptions(draft_model=ggufs["draft"]), opened(ggufs["model"]), adapter
    )
    facts = read_facts(ggufs["draft"])
    expected = (
        facts.total_bytes
        - facts.embedding_bytes
        + kv_cache_bytes(facts, 8192, "f16", CacheLayout())
        + gpu_compute(get_engine("llama.cpp").buffer_fits, facts, 8192, 512, latent=False).bytes
    )
    assert draft_vram_bytes(draft, adapter, 8192, 512) == expected > 0 and draft is not None
    assert options.draft_model == draft.path
    assert draft_vram_bytes(None, adapter, 8192, 512) == 0
    # The MTP layer is one of the file's layers: its weights and KV are in the model's plan already.
    mtp_shape = dataclasses.replace(TINY_SHAPES["deepseek2"], mtp_layers=1)
    read = read_facts(ggufs["mtp"])
    assert (read.layers, read.nextn_layers) == (mtp_shape.layers + 1, 1)
    assert shape_facts(mtp_shape) == read


def test_mtp_is_refused_for_a_model_with_a_recurrent_state(tmp_path: Path) -> None:
    """Ling-3's MTP block: mainline drafts with it, and keeps a copy of the KDA layers' state for each
    drafted token (its n_rs_seq rows at 0c1e57098: the tiny file logged 3 more with --mtp), which the plan
    doesn't count: refused."""
    model = write_moe_gguf(tmp_path / "ling3.gguf", TINY["bailingmoe3"])
    with pytest.raises(SpecError, match=r"^ling3.gguf keeps a recurrent state, .* drop --mtp$"):
        checked_speculative(EngineOptions(mtp=True), opened(model), get_engine("llama.cpp"))


def test_mtp_for_deepseek_v4_says_its_head_is_a_file_of_its_own(tmp_path: Path) -> None:
    """DeepSeek-V4's converter never puts its MTP head in the model's file (`--mtp` writes mtp-<name>.gguf):
    the refusal says so, not the advice for DeepSeek-V3's and Qwen3-Next's heads (`--no-mtp`)."""
    model = write_moe_gguf(tmp_path / "v4.gguf", TINY["deepseek4"])
    with pytest.raises(
        SpecError, match=r"deepseek4's converter writes it to a file of its own .*; drop --mtp$"
    ):
        checked_speculative(EngineOptions(mtp=True), opened(model), get_engine("llama.cpp"))


@dataclasses.dataclass(frozen=True)
class _MtpHeadAlone(DeepSeek2Shape):
    """What `convert_hf_to_gguf.py --mtp` writes (conversion/deepseek.py at 0c1e57098, `mtp_only`): the
    NextN block, the embeddings, the final norm and the output head, and none of the model's layers."""

    def tensors(self, n_vocab: int) -> Iterator[Tensor]:
        for tensor in super().tensors(n_vocab):
            name = tensor[0]
            if not name.startswith("blk.") or int(name.split(".")[1]) >= self.layers:
                yield tensor


def test_an_mtp_head_alone_is_refused_as_a_model_and_as_a_draft(ggufs: dict[str, Path]) -> None:
    """A head converted apart drafts only beside its model (mainline's `-md` with `--spec-type draft-mtp`,
    which moe-stack doesn't plan): given as the model or as a draft model, it is refused in one line,
    not served as a small model of its own."""
    shape = {**dataclasses.asdict(TINY_SHAPES["deepseek2"]), "mtp_layers": 1}
    head = write_moe_gguf(ggufs["model"].parent / "mtp-r1.gguf", _MtpHeadAlone(**shape))
    said = r"^mtp-r1.gguf holds a multi-token-prediction head alone .*, and --mtp where that file carries"
    with pytest.raises(ModelError, match=said):
        read_facts(head)
    with pytest.raises(ModelError, match=said):
        checked_speculative(EngineOptions(draft_model=head), opened(ggufs["mtp"]), get_engine("llama.cpp"))
