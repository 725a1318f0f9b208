"""Which optional extra a command needs, and the hint a base install prints instead of a traceback.

The base wheel is the client side only (the progress contract and the framework integrations) and
pulls nothing; ``gpu-watchdog status``, ``triage``, ``run`` and ``ft-trainer gate`` need the
``[daemon]`` extra (the gate runs on its numpy, without torch), the other ``ft-trainer`` commands the
``[trainer]`` extra. A command that imports a missing extra's module exits 2 (bad
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


#: The extra each ``ft-trainer`` command needs (``gate`` imports no torch: numpy of [daemon] suffices).
TRAINER_COMMAND_EXTRAS = {"gate": "daemon"}


def trainer_command_extra(command: str) -> str:
    return TRAINER_COMMAND_EXTRAS.get(command, "trainer")


def checkout_extra_hint(prog: str, command: str, error: ModuleNotFoundError, extra: str) -> str | None:
    """As :func:`missing_extra_hint`, for a tool of the checkout (the trainer's dev tools, not in the
    wheel): the fix is ``make install`` (``make run`` installs the [daemon] extra only)."""
    name = (error.name or "").partition(".")[0]
    if name not in EXTRA_MODULES[extra]:
        return None
    return (
        f"{prog}: `{command}` needs the [{extra}] extra, which this environment lacks (no Python module "
        f"{name!r}): `make run` sets up the daemon only. Install the rest with\n"
        f"  make install\n"
        f"(torch CPU, DeepSpeed, transformers; `make test` and `make demo` do it too)"
    )


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
