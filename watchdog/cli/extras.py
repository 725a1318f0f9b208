"""Which optional extra a command needs, and the hint a base install prints instead of a traceback.

The base wheel is the client side only (the progress contract and the framework integrations) and
pulls nothing; ``gpu-watchdog status``, ``triage``, ``run`` and ``ft-trainer gate`` need the
``[daemon]`` or ``[trainer]`` extra. A command that imports a missing extra's module exits 2 (bad
input: the installation) with the ``pip install`` line that fixes it, never 1 (which means "a
deadlock verdict"). Standard library only: this module runs where nothing else is installed.
"""

from __future__ import annotations

from gpu_triage import DISTRIBUTION, __version__

#: Top-level import names the [daemon] extra provides (with what its packages pull in themselves).
DAEMON_MODULES = frozenset(
    {
        "numpy",
        "pyarrow",
        "matplotlib",
        "pynvml",
        "psutil",
        "fastapi",
        "starlette",
        "pydantic",
        "uvicorn",
        "prometheus_client",
        "tqdm",
        "tomli_w",
        "httpx",
        "httpcore",
        "anyio",
    }
)
#: Those of the [trainer] extra.
TRAINER_MODULES = DAEMON_MODULES | {
    "torch",
    "deepspeed",
    "transformers",
    "tokenizers",
    "accelerate",
    "pytorch_lightning",
    "lightning",
}
EXTRA_MODULES = {"daemon": DAEMON_MODULES, "trainer": TRAINER_MODULES}
WHEEL = f"{DISTRIBUTION.replace('-', '_')}-{__version__}-py3-none-any.whl"


def missing_extra_hint(prog: str, command: str, error: ModuleNotFoundError, extra: str) -> str | None:
    """The message for ``error`` raised by ``prog command`` when ``extra`` is not installed, or None
    when the missing module is not one the extra provides (a real bug: let it raise)."""
    name = (error.name or "").partition(".")[0]
    if name not in EXTRA_MODULES[extra]:
        return None
    return (
        f"{prog}: `{prog} {command}` needs the [{extra}] extra, which this installation lacks "
        f"(no Python module {name!r}). Install it into this environment:\n"
        f"  pip install '{WHEEL}[{extra}]'\n"
        f"(the wheel from `make dist`; the base install is the client side only: "
        f"docs/operator-guide.md, 'Install on a node')"
    )
