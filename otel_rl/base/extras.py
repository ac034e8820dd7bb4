"""Which optional package each feature needs, and the one error that names its extra.

The training process checks an output's package before anything starts
(``init(tensorboard=True)`` without tensorboard raises here, not in the agent),
an agent checks it before it finishes another process's run, and the command
line names the extra of a subcommand in one line.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    """An optional feature: the module it imports and the extra that installs it."""

    feature: str
    module: str
    extra: str

    def missing(self) -> bool:
        """True when the module cannot be imported here."""
        try:
            return importlib.util.find_spec(self.module) is None
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            return True

    def message(self) -> str:
        return f"{self.feature} needs the {self.module} package: pip install 'otel-rl[{self.extra}]'"


OUTPUTS = {
    "tensorboard": Extra("tensorboard=True", "tensorboard", "tensorboard"),
    "wandb": Extra("wandb=True", "wandb", "wandb"),
    "trackio": Extra("trackio=True", "trackio", "trackio"),
    "swanlab": Extra("swanlab=True", "swanlab", "swanlab"),
}
"""The options of :class:`otel_rl.TelemetryConfig` that switch on an output with a package of its own."""

SERVE = Extra("otel-rl serve", "aiohttp", "serve")
POSTGRES = Extra("otel-rl serve --db postgresql://", "psycopg", "serve")
PLOT = Extra("otel-rl analyze --plot", "matplotlib", "analysis")
READ = Extra("reading runs into DataFrames (otel_rl.read, otel-rl export)", "pandas", "read")
MEDIA = {"video": Extra("tel.video() of frames", "imageio_ffmpeg", "media"), "image": Extra("tel.image() of an array", "imageio_ffmpeg", "media")}
"""What turns frames into a file (a file given by its path needs neither)."""
DEMO = (Extra("otel-rl demo", "torch", "demo"), Extra("otel-rl demo", "gymnasium", "demo"))

INTEGRATIONS = {
    "sb3": Extra("otel_rl.integrations.sb3 (Stable-Baselines3)", "stable_baselines3", "sb3"),
    "torchrl": Extra("otel_rl.integrations.torchrl (TorchRL)", "torchrl", "torchrl"),
    "rllib": Extra("otel_rl.integrations.rllib (RLlib)", "ray.rllib", "rllib"),
    "trl": Extra("otel_rl.integrations.trl (TRL)", "trl", "trl"),
    "verl": Extra("otel_rl.integrations.verl (verl)", "verl", "verl"),
}
"""The integrations that import their library when imported (RSL-RL's and skrl's take the library's objects as given)."""


class MissingExtra(ImportError):
    """An optional package a requested feature needs is not installed; the message names the extra."""


def require(*needed: Extra) -> None:
    """Raise :class:`MissingExtra` naming the first of ``needed`` whose module is missing."""
    for extra in needed:
        if extra.missing():
            raise MissingExtra(extra.message())


def missing_outputs(config: object) -> list[Extra]:
    """The outputs ``config`` switches on whose package this process cannot import."""
    return [extra for option, extra in OUTPUTS.items() if getattr(config, option, False) and extra.missing()]
