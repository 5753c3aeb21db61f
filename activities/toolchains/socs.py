"""Snapdragon SoCs fleetforge can target: name ↔ QNN `soc_model` ↔ HTP architecture."""

from __future__ import annotations

from pydantic import BaseModel

from contracts.errors import Err, FleetforgeError


class Soc(BaseModel, frozen=True):
    name: str
    soc_model: int
    htp_arch: int

    @property
    def arch_name(self) -> str:
        return f"v{self.htp_arch}"


SOCS: tuple[Soc, ...] = (
    Soc(name="SM8350", soc_model=30, htp_arch=68),
    Soc(name="SM8450", soc_model=36, htp_arch=69),
    Soc(name="SM8550", soc_model=43, htp_arch=73),
    Soc(name="SM8650", soc_model=57, htp_arch=75),
    Soc(name="SM8750", soc_model=69, htp_arch=79),
    Soc(name="SM8850", soc_model=87, htp_arch=81),
)
_BY_NAME = {s.name: s for s in SOCS}


def soc_names() -> list[str]:
    return [s.name for s in SOCS]


def lookup_soc(name: str) -> Soc:
    """The SoC called `name` (case-insensitive: "sm8550" == "SM8550")."""
    key = name.strip().upper() if isinstance(name, str) else ""
    soc = _BY_NAME.get(key)
    if soc is None:
        raise FleetforgeError(Err.BAD_INPUT, f"unknown SoC {name!r}; valid: {', '.join(soc_names())}")
    return soc


def soc_by_model(soc_model: int) -> Soc:
    for s in SOCS:
        if s.soc_model == soc_model:
            return s
    raise FleetforgeError(Err.BAD_INPUT, f"unknown soc_model {soc_model!r}; valid: {', '.join(f'{s.name}={s.soc_model}' for s in SOCS)}")
