"""The extraction and analysis options, each declared once (:class:`Option`).

From these declarations come ``attnbase extract``'s and ``attnbase analyze``'s command-line
options (:meth:`Option.typer`), the checks of :class:`~attnbase.extract.config.ExtractConfig`
and of a pipeline file's keys (``flows/config.py``), each with the same message
(:meth:`Option.problem`), and the option tables of docs/commands.md (``python -m
attnbase.options`` prints them; a test holds the page to it).

A plain dataclass, not a pydantic model: every ``attnbase`` command builds its options when it
starts, and importing pydantic there costs each command's start more than the whole option
table (benchmarks/RESULTS.md: "the options on pydantic"). A bottom module: it imports no stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbase.contract import CAPTURE_CHOICES, DEFAULT_CAPTURE, STORE_DTYPES

#: the database a command or a pipeline uses when neither ``--db`` (a pipeline's ``db`` key) nor
#: ``ATTNBASE_DB`` names one
DB_DEFAULT = "attnbase-db"
DB_ENV = "ATTNBASE_DB"

#: the model's compute dtypes (``--dtype``)
DTYPES = ("float32", "float16", "bfloat16")
#: Ablation variants and initialisations (model surgery in :mod:`attnbase.extract.variants`).
VARIANTS = ("full", "no-mlp", "no-skip", "attention-only")
INITS = ("pretrained", "random")
#: Position-0 conventions of causal LMs (``--bos``): ``auto`` prepends the tokenizer's BOS where it
#: declares one (extract/corpus.py); ``none`` adds nothing, so position 0 is a text token (the
#: convention of GPT-2, whose tokenizer has no BOS, in "All Routes Lead to Collapse").
BOS_CHOICES = ("auto", "none")
#: Draws of each head's mean VE@8 under each null for the empirical p-value (docs/metrics.md §8);
#: the CLT p-value does not depend on it.
NULL_DRAWS = 200


@dataclass(frozen=True)
class Option:
    """One option: ``name`` is its field (ExtractConfig) or argument (``analyze_run``),
    ``flag`` (and ``short``) what a user types, ``key`` its pipeline-file key where that
    differs from ``name`` (``""``: a pipeline file does not take it); ``min`` or ``choices``
    bound it (``why`` says why the bound)."""

    name: str
    flag: str
    help: str
    default: Any = None
    short: str | None = None
    min: int | None = None
    choices: tuple[str, ...] | None = None
    why: str = ""
    key: str | None = None

    @property
    def pipeline_key(self) -> str:
        return self.name if self.key is None else self.key

    def problem(self, value: Any, called: str | None = None) -> str | None:
        """What is wrong with ``value``, as one line naming the option ``called`` (default its
        flag), or None. A tuple or list is checked item by item against ``choices``."""
        name = called or self.flag
        if value is None or value is ...:
            return None
        if self.min is not None and value < self.min:
            why = f" ({self.why})" if self.why else ""
            return f"{name} must be >= {self.min}{why}, got {value}"
        if self.choices is not None:
            items = value if isinstance(value, (tuple, list)) else (value,)
            bad = [v for v in items if v not in self.choices]
            if bad:
                return f"unknown {name} {bad[0]!r}; use one of {', '.join(self.choices)}"
        return None

    def cli_default(self) -> Any:
        """The default as the command line takes it (a tuple as comma-separated names)."""
        return ",".join(self.default) if isinstance(self.default, tuple) else self.default

    def typer(self):
        """This option as a ``typer.Option`` (the bound is checked by :meth:`problem`, so that
        the command's message is the pipeline file's)."""
        import typer

        decls = (self.flag, self.short) if self.short else (self.flag,)
        return typer.Option(self.cli_default(), *decls, help=self.help)


def first_problem(options: dict[str, Option], values: dict[str, Any]) -> str | None:
    """The first problem of ``values`` (``{name: value}``) by ``options``' order, naming each by
    its flag; None when every value is within its bounds."""
    for name, opt in options.items():
        if name in values:
            msg = opt.problem(values[name])
            if msg:
                return msg
    return None


def pipeline_options() -> dict[str, Option]:
    """``{pipeline key: Option}`` of every option a pipeline file takes."""
    return {o.pipeline_key: o for o in (*EXTRACT_OPTIONS.values(), *ANALYSIS_OPTIONS.values())
            if o.pipeline_key}


def _table(*options: Option) -> dict[str, Option]:
    return {o.name: o for o in options}


#: ``attnbase extract``'s options, the fields of ExtractConfig.
EXTRACT_OPTIONS = _table(
    Option("model", "--model", "alias (minilm, smollm2-135m, gemma3-270m, tiny-gpt2, tiny-neox, "
           "tiny-llama, tiny-gemma3), local HF model directory, or hub id (needs network)",
           default=..., short="-m", key="models"),
    Option("corpus", "--corpus", "'default', a .txt/.jsonl/.parquet file or a directory of .txt; "
           "probes: 'probe:repeat-random', 'probe:random', 'probe:repeat-token'; images: "
           "'images:sample' or a directory of PNG/JPEG", default="default", short="-c",
           key="corpora"),
    Option("n_seqs", "--seqs", "number of token windows", default=8, short="-n", min=1,
           key="seqs"),
    Option("seq_len", "--seq-len", "tokens per window (default 64; images: the model's)",
           short="-t", min=4, why="sink + content rows"),
    Option("batch_size", "--batch-size", "windows per forward pass", default=4, short="-b",
           min=1),
    Option("dtype", "--dtype", "the model's compute dtype: float32 | float16 | bfloat16",
           default="float32", choices=DTYPES),
    Option("store_dtype", "--store-dtype", "what the float arrays are written in: float32 | "
           "float16 | bfloat16 (default: float32; float16 for a float16 model); statistics "
           "always come from the float32 logits", choices=STORE_DTYPES, key=""),
    Option("device", "--device", "auto | cpu | cuda | cuda:N", default="auto"),
    Option("capture", "--capture", "comma-separated subset of keys,queries,logits,hidden; "
           "attn_logits are derived from queries and keys on read where the family allows "
           "(float32), stored otherwise; add logits to store them always",
           default=DEFAULT_CAPTURE, choices=CAPTURE_CHOICES),
    Option("seed", "--seed", "seed for choosing windows", default=0, min=0),
    Option("variant", "--variant", "ablation: full | no-mlp | no-skip | attention-only",
           default="full", choices=VARIANTS, key=""),
    Option("init", "--init", "pretrained | random (seeded re-init of the architecture)",
           default="pretrained", choices=INITS, key=""),
    Option("init_seed", "--init-seed", "seed of --init random", default=0, min=0, key=""),
    Option("bos", "--bos", "auto: prepend the tokenizer's BOS where it declares one (causal "
           "LMs); none: nothing, position 0 is text", default="auto", choices=BOS_CHOICES),
)

#: ``attnbase analyze``'s options, the arguments of ``stats.analyze.analyze_run``.
ANALYSIS_OPTIONS = _table(
    Option("draws", "--draws", "shuffle-null draws of each head's VE@8 (empirical p)",
           default=NULL_DRAWS, min=1),
    Option("gauss_draws", "--gauss-draws", "Gauss-null draws of each head's VE@8 (empirical p)",
           default=NULL_DRAWS, min=1, key=""),
    Option("seq_draws", "--seq-draws", "shuffled copies of each shuffled sequence (default: "
           ">= 2, >= 128 per head)", min=2, key=""),
    Option("shuffle_seqs", "--shuffle-seqs", "sequences per head given shuffled copies, a "
           "uniform sample (default 64)", min=2, key=""),
    Option("seed", "--seed", "seed of the nulls and the bootstrap", default=0, min=0),
    Option("onset_threshold", "--threshold", "onset: first layer with mean max_share above it",
           default=0.2, key=""),
)


def markdown(options: dict[str, Option]) -> str:
    """The docs' table of ``options``: flag, pipeline key, default, bound, help."""
    rows = ["| option | pipeline key | default | bound | what |", "|---|---|---|---|---|"]
    for o in options.values():
        short = f", `{o.short}`" if o.short else ""
        default = ("required" if o.default is ... else "-" if o.default is None
                   else f"`{o.cli_default()}`")
        bound = (f">= {o.min}" if o.min is not None else
                 " \\| ".join(o.choices) if o.choices else "-")
        key = f"`{o.pipeline_key}`" if o.pipeline_key else "-"
        rows.append(f"| `{o.flag}`{short} | {key} | {default} | {bound} | "
                    f"{o.help.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def docs_section() -> str:
    """The generated part of docs/commands.md."""
    return ("### attnbase extract\n\n" + markdown(EXTRACT_OPTIONS)
            + "\n\n### attnbase analyze\n\n" + markdown(ANALYSIS_OPTIONS) + "\n")


if __name__ == "__main__":
    print(docs_section(), end="")
