"""The starter model: a small Qwen2 code model Strop builds itself, since nothing can be downloaded.

A byte-level BPE tokenizer and a Qwen2ForCausalLM trained with fill-in-the-middle (PSM order,
mixed with plain left-to-right text) on the Python standard library found on this machine.
The result is an ordinary Hugging Face directory that transformers and vLLM load.

Built once per recipe: the directory name carries a hash of every hyper-parameter, the corpus
spec and ``STARTER_CODE_VERSION``, so a changed recipe builds a new directory and an unchanged
one is returned at once. A build runs in a temporary directory renamed into place at the end,
so a crash never leaves a half model behind (``cache.build_once``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from learning_shared.fim import FIM_FORMATS
from model_supply.cache import build_once, default_cache_root, pin_tokenizer_class

# Bump when the build code changes in a way that changes the model for the same recipe.
STARTER_CODE_VERSION = 1

_QWEN = FIM_FORMATS["qwen"]
EOS_TOKEN = _QWEN.eos_token
PAD_TOKEN = "<|fim_pad|>"
# Order fixes the ids: 0 eos, 1 fim_prefix, 2 fim_suffix, 3 fim_middle, 4 pad.
SPECIAL_TOKENS: tuple[str, ...] = (
    EOS_TOKEN,
    _QWEN.prefix_token,
    _QWEN.suffix_token,
    _QWEN.middle_token,
    PAD_TOKEN,
)
# vLLM's CPU attention kernels support a fixed set of head sizes; 64 is one of them.
HEAD_DIM = 64
# Directories of the stdlib that are not representative code (tests, py2 fixtures, vendored).
_SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "lib2to3", "site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class StarterRecipe:
    """Everything that determines the starter model's bytes (hashed into its directory name)."""

    size: str
    vocab_size: int  # BPE target, including the special tokens; rounded up to 64 for the model
    hidden_size: int  # = num_attention_heads * HEAD_DIM
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    seq_len: int  # training sequence length in tokens
    batch_size: int
    steps: int
    learning_rate: float
    warmup_steps: int
    fim_rate: float  # share of training sequences in PSM order
    max_middle_tokens: int  # FIM middles are 1..this many tokens (a line or two, as in completion)
    tokenizer_corpus_bytes: int
    model_corpus_bytes: int
    max_file_bytes: int  # larger source files are skipped
    seed: int
    corpus_root: str  # the stdlib directory
    python_version: str  # the stdlib's contents follow the interpreter version
    code_version: int = STARTER_CODE_VERSION

    def digest(self) -> str:
        """Short stable hash of the recipe."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def starter_recipe(size: str) -> StarterRecipe:
    """The recipe of ``size`` (``tiny``: seconds, for tests; ``small``: minutes, for the demo)."""
    common = dict(
        corpus_root=sysconfig.get_paths()["stdlib"],
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        max_file_bytes=200_000,
        seed=1234,
        fim_rate=0.5,
    )
    if size == "tiny":
        return StarterRecipe(
            size="tiny", vocab_size=2048, hidden_size=128, num_layers=2, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=256, max_position_embeddings=2048,
            seq_len=128, batch_size=8, steps=80, learning_rate=4e-3, warmup_steps=10,
            max_middle_tokens=24, tokenizer_corpus_bytes=1_000_000, model_corpus_bytes=1_000_000,
            **common,  # type: ignore[arg-type]
        )
    if size == "small":
        return StarterRecipe(
            size="small", vocab_size=8192, hidden_size=256, num_layers=4, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=512, max_position_embeddings=4096,
            seq_len=128, batch_size=16, steps=360, learning_rate=5e-3, warmup_steps=20,
            max_middle_tokens=32, tokenizer_corpus_bytes=4_000_000, model_corpus_bytes=4_000_000,
            **common,  # type: ignore[arg-type]
        )
    raise ValueError(f"unknown starter size {size!r}; known: tiny, small")


def ensure_starter_model(size: str, cache_root: Path | None = None, *, progress: bool = False) -> Path:
    """The directory of the ``size`` starter model, building it first if its recipe is new."""
    recipe = starter_recipe(size)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / f"starter-{size}-{recipe.digest()}"
    # A lambda, not the function itself: the build is looked up when it runs (tests replace it).
    return build_once(target, lambda tmp: build_starter_model(recipe, tmp, progress=progress), key=f"starter-{size}")


def _corpus_files(recipe: StarterRecipe) -> list[Path]:
    root = Path(recipe.corpus_root)
    files = [
        p for p in root.rglob("*.py")
        if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1])
        and p.stat().st_size <= recipe.max_file_bytes
    ]
    # Ordered by a hash of the relative path: deterministic, yet a budget covers the whole
    # library instead of the modules that sort first alphabetically.
    return sorted(files, key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest())


def _read_corpus(files: list[Path], budget: int) -> list[str]:
    texts: list[str] = []
    used = 0
    for path in files:
        if used >= budget:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        used += len(text.encode())
    return texts


def _train_tokenizer(recipe: StarterRecipe, texts: list[str]):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _save_tokenizer(tokenizer, out_dir: Path, max_length: int) -> None:
    from transformers import PreTrainedTokenizerFast

    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:4]),
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.save_pretrained(out_dir)
    pin_tokenizer_class(out_dir)


def _training_sequences(recipe: StarterRecipe, stream: list[int], rng: random.Random) -> Iterator[list[int]]:
    """Endless training sequences of exactly ``seq_len`` tokens: PSM FIM or plain windows."""
    eos, fim_prefix, fim_suffix, fim_middle = range(4)  # ids fixed by SPECIAL_TOKENS' order
    while True:
        if rng.random() < recipe.fim_rate:
            window = recipe.seq_len - 4
            start = rng.randrange(0, len(stream) - window)
            doc = stream[start:start + window]
            middle_len = rng.randint(1, recipe.max_middle_tokens)
            cut = rng.randint(1, window - middle_len - 1)
            prefix, middle, suffix = doc[:cut], doc[cut:cut + middle_len], doc[cut + middle_len:]
            yield [fim_prefix, *prefix, fim_suffix, *suffix, fim_middle, *middle, eos]
        else:
            start = rng.randrange(0, len(stream) - recipe.seq_len)
            yield stream[start:start + recipe.seq_len]


def build_starter_model(recipe: StarterRecipe, out_dir: Path, *, progress: bool = False) -> dict:
    """Train tokenizer and model of ``recipe`` into the (existing, empty) ``out_dir``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    started = time.monotonic()
    files = _corpus_files(recipe)
    tokenizer = _train_tokenizer(recipe, _read_corpus(files, recipe.tokenizer_corpus_bytes))
    vocab_size = math.ceil(tokenizer.get_vocab_size() / 64) * 64
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, token

    texts = _read_corpus(files, recipe.model_corpus_bytes)
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        stream.extend(encoding.ids)
        stream.append(0)  # eos between files

    import torch.utils.deterministic

    deterministic_before = torch.are_deterministic_algorithms_enabled()
    fill_before = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # NaN-filling costs ~2x on CPU
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    config = Qwen2Config(  # type: ignore[call-arg]  # head_dim and rope_theta go through its **kwargs
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=4,
        dtype="float32",
    )
    assert config.hidden_size == config.num_attention_heads * HEAD_DIM
    model = Qwen2ForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step: int) -> float:
        if step < recipe.warmup_steps:
            return recipe.learning_rate * (step + 1) / recipe.warmup_steps
        progress_frac = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
        return recipe.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_frac)))

    sequences = _training_sequences(recipe, stream, rng)
    losses: list[float] = []
    from tqdm import tqdm

    bar = tqdm(range(recipe.steps), desc=f"starter-{recipe.size}", disable=not progress)
    try:
        for step in bar:
            batch = torch.tensor([next(sequences) for _ in range(recipe.batch_size)], dtype=torch.long)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        torch.use_deterministic_algorithms(deterministic_before)
        torch.utils.deterministic.fill_uninitialized_memory = fill_before  # type: ignore[attr-defined]

    model.eval()
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 4
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(tokenizer, out_dir, recipe.max_position_embeddings)
    info = {
        "recipe": dataclasses.asdict(recipe),
        "recipe_digest": recipe.digest(),
        "vocab_size": vocab_size,
        "corpus_tokens": len(stream),
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "strop_starter.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
