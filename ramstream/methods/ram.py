"""RAM, RAM+ and RAM+s (Reinforced Agent Merging, arXiv 2601.13572, section 4 and appendix E).

lambda_t rescales what only agent t changed:
  paper rule (RAM+):  1 + r * clip(rho_t, 0, alpha),  rho_t = shared_t / unique_t
  script rule:        1 + r * min(1, rho_t)  (the authors' script, 1 + (R-1) min(1, rho), R = 1 + r)
  RAM+s:              1 + r * shared_t / (shared_t + unique_t)
  RAM:                1 (r = 0)
rho comes from the whole model (the paper) or from each tensor (mergekit's ``ramplus_tl``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import Fused, MethodSpec, Prepared, refuse_unknown
from ramstream.methods.options import FLOAT32_MAX, OptionError
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext
from ramstream.statistics.overlap import OverlapCounts, model_total

RhoScope = Literal["model", "tensor"]
LambdaRule = Literal["paper", "script", "share"]


@dataclass(frozen=True)
class RamParams:
    r: float = 0.1
    alpha: float = 2.0
    rho_scope: RhoScope = "model"
    lambda_rule: LambdaRule = "paper"

    def __post_init__(self) -> None:
        if not np.isfinite(self.r) or self.r < 0:
            raise OptionError("r", f"must be a finite number >= 0, got {self.r}")
        if not np.isfinite(self.alpha) or self.alpha < 0:
            raise OptionError("alpha", f"must be a finite number >= 0, got {self.alpha}")
        if self.rho_scope not in ("model", "tensor"):
            raise OptionError("rho_scope", f"must be model or tensor, got {self.rho_scope!r}")
        if self.lambda_rule not in ("paper", "script", "share"):
            raise ConfigError(f"unknown lambda rule {self.lambda_rule!r}")
        cap = self.alpha if self.lambda_rule == "paper" else 1.0
        if 1.0 + self.r * cap > FLOAT32_MAX:  # lambda = 1 + r * clip(rho, 0, cap) must stay a float32
            raise ConfigError(
                f"--r {self.r:g} (with alpha {cap:g}) makes lambda overflow float32, where merges compute; lower it"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RamMerge:
    """RAM's parameters as a merge takes them: ``rule`` (rho's scope and the lambda rule, r and
    alpha where they are one value) and r and alpha themselves, which may differ per tensor
    (gradients and filters, as mergekit reads them; each tensor's lambdas use its own)."""

    rule: RamParams
    r: ts.Setting
    alpha: ts.Setting

    def to_dict(self) -> dict[str, Any]:
        return {**self.rule.to_dict(), "r": ts.to_json(self.r), "alpha": ts.to_json(self.alpha)}


def lambdas(counts: OverlapCounts, params: RamParams) -> np.ndarray:
    """lambda per agent (last axis) for counts of any leading shape."""
    return _lambdas(counts, params.lambda_rule, params.r, params.alpha)


def _lambdas(counts: OverlapCounts, rule: LambdaRule, r: float | np.ndarray, alpha: float | np.ndarray) -> np.ndarray:
    """``lambdas`` with r and alpha numbers, or arrays that broadcast against the counts."""
    if rule == "share":
        shared = counts.shared.astype(np.float64)
        touched = shared + counts.unique
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(touched > 0, shared / np.maximum(touched, 1), 0.0)
        return 1.0 + r * share
    rho = counts.rho()
    cap = 1.0 if rule == "script" else alpha
    return 1.0 + r * np.clip(rho, 0.0, cap)


def ram_lambdas(params: RamMerge, tensors: OverlapCounts, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """lambda per tensor and agent (float32, what the kernel uses) and per agent over the model
    (None when r or alpha differ per tensor: no one lambda per agent then)."""
    rule = params.rule
    uniform = ts.uniform((params.r, params.alpha)) is not None
    model = lambdas(model_total(tensors), rule) if uniform else None
    r = ts.resolve(params.r, names)[:, None]
    alpha = ts.resolve(params.alpha, names)[:, None]
    counts = tensors if rule.rho_scope == "tensor" else model_total(tensors)
    per_tensor = np.broadcast_to(_lambdas(counts, rule.lambda_rule, r, alpha), tensors.unique.shape)
    return np.ascontiguousarray(per_tensor, dtype=np.float32), model


def prepare_ram(params: RamMerge, ctx: StatsContext) -> Prepared:
    per_tensor, model = ram_lambdas(params, ctx.overlap(), [t.name for t in ctx.plan.tensors])
    eps = ctx.eps

    def merge_many(
        arrays: BlockArrays,
        block: Block,
        owns: Sequence[np.ndarray],
        outs: Sequence[np.ndarray],
        out_code: int,
        backend: Backend,
    ) -> int:
        lambdas = np.stack([own[block.tensor] for own in owns])
        return backend.merge_ram(arrays, eps, lambdas, outs, out_code)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return merge_many(arrays, block, [per_tensor], [out], out_code, backend)

    fused = Fused(("ram", eps), per_tensor, merge_many)  # every RAM variant: only the lambdas differ
    return Prepared(merge_block, {} if model is None else {"lambda": tuple(float(x) for x in model)}, fused)


RAM_METHODS: dict[str, tuple[str, RamParams]] = {
    "ram": ("RAM: mean where agents overlap, unique updates kept as they are", RamParams(r=0.0)),
    "ram+": ("RAM+: unique updates rescaled by 1 + r * clip(shared/unique, 0, alpha)", RamParams()),
    "ram+s": ("RAM+s: unique updates rescaled by 1 + r * shared/(shared+unique)", RamParams(lambda_rule="share")),
}
RAM_OPTIONS = {"r", "alpha", "rho_scope", "lambda_rule"}


def ram_spec(name: str) -> MethodSpec:
    summary, _ = RAM_METHODS[name]

    def parse(options: Mapping[str, Any], n_agents: int) -> RamMerge:
        refuse_unknown(name, options, RAM_OPTIONS)
        r, alpha = _setting("r", options.get("r")), _setting("alpha", options.get("alpha"))
        scope, rule = options.get("rho_scope"), options.get("lambda_rule")
        for r_value, alpha_value in itertools.product(_values(r), _values(alpha)):
            ram_params(name, r_value, alpha_value, scope, rule)  # every value a tensor can take, checked
        params = ram_params(name, _values(r)[0], _values(alpha)[0], scope, rule)
        return RamMerge(params, params.r if r is None else r, params.alpha if alpha is None else alpha)

    def check(params: RamMerge, names: Sequence[str]) -> None:
        ts.check([params.r, params.alpha], names)

    return MethodSpec(name, summary, parse, prepare_ram, check=check)


def _setting(name: str, value: Any) -> ts.Setting | None:
    return None if value is None else ts.parse(name, value)


def _values(setting: ts.Setting | None) -> tuple[float | None, ...]:
    """The values a setting gives tensors at its gradients' ends (None: not given)."""
    return (None,) if setting is None else ts.values(setting)


def ram_params(
    name: str,
    r: float | None = None,
    alpha: float | None = None,
    rho_scope: RhoScope | None = None,
    lambda_rule: Literal["paper", "script"] | None = None,
) -> RamParams:
    """Validated parameters of ``name``, refusing options that the method would ignore."""
    default = RAM_METHODS[name][1]
    if name == "ram" and r not in (None, 0.0):
        raise ConfigError("--r has no effect with --method ram (lambda is 1); use ram+ to rescale")
    if name == "ram+s" and lambda_rule not in (None, "paper"):
        raise ConfigError("--lambda-rule applies to ram+ only; ram+s has its own rule")
    if alpha is not None and (name != "ram+" or lambda_rule == "script"):
        raise ConfigError("--alpha applies to ram+ with the paper's lambda rule only")
    rule: LambdaRule = "share" if name == "ram+s" else (lambda_rule or "paper")
    return RamParams(
        r=default.r if r is None else r,
        alpha=default.alpha if alpha is None else alpha,
        rho_scope=rho_scope or "model",
        lambda_rule=rule,
    )
