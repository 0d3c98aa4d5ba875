"""What ramstream reads of mergekit's configs: its methods and their parameters (``METHODS``), the
top-level keys, output dtypes, and the CLI flag of each setting (for messages)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ramstream.errors import ConfigError

Kind = Literal["float", "bool"]


Scope = Literal["shared", "model"]


Fail = Callable[[str], ConfigError]


@dataclass(frozen=True)
class Param:
    """One mergekit parameter: its name in the YAML, the ramstream option it becomes, whether it
    is one value for the merge or one per model, and mergekit's default (None: required)."""

    name: str
    option: str
    scope: Scope
    kind: Kind
    default: float | bool | None = None
    varying: bool = False  # takes gradients and filters (a value per tensor)


@dataclass(frozen=True)
class MethodMap:
    """A mergekit method as ramstream runs it: ramstream's method, the parameters, the settings
    the mergekit method implies (``fixed``: always; ``implied``: unless the config gives them)."""

    method: str
    params: tuple[Param, ...]
    fixed: tuple[tuple[str, Any], ...] = ()
    implied: tuple[tuple[str, Any], ...] = ()
    base: Literal["required", "optional"] = "required"  # optional: without base_model, BASE is a model
    agents: tuple[int, int | None] = (1, None)  # how many models besides the base (min, max)


WEIGHT = Param("weight", "weights", "model", "float", varying=True)  # linear: one per model, no default


LAMBDA = Param("lambda", "lambda", "shared", "float", 1.0, varying=True)


DENSITY = Param("density", "density", "model", "float", 1.0, varying=True)


GAMMA = Param("gamma", "gamma", "model", "float", 0.01, varying=True)


DELLA_EPSILON = Param("epsilon", "epsilon", "model", "float", 0.15, varying=True)


NORMALIZE = Param("normalize", "normalize", "shared", "bool")


RESCALE = Param("rescale", "rescale", "shared", "bool")


RAM_EPSILON = Param("epsilon", "eps", "shared", "float", 1e-5)


INT8_MASK = Param("int8_mask", "int8_mask", "shared", "bool", False)


T = Param("t", "t", "shared", "float", varying=True)


VARYING_WEIGHT = Param("weight", "weights", "model", "float", varying=True)  # GTA and spherical methods


_GTA = (VARYING_WEIGHT, LAMBDA, NORMALIZE)


_SPARSE = (*_GTA, DENSITY, RESCALE)


# mergekit's methods that ramstream runs, with the parameters that change mergekit's result.
METHODS: dict[str, MethodMap] = {
    "linear": MethodMap("linear", (WEIGHT, NORMALIZE)),
    "task_arithmetic": MethodMap("task_arithmetic", _GTA),
    "ties": MethodMap("ties", _SPARSE),
    "dare_linear": MethodMap("dare_linear", _SPARSE),
    "dare_ties": MethodMap("dare_ties", _SPARSE),
    "breadcrumbs": MethodMap("breadcrumbs", (*_SPARSE, GAMMA)),
    "breadcrumbs_ties": MethodMap("breadcrumbs_ties", (*_SPARSE, GAMMA)),
    "della": MethodMap("della", (*_SPARSE, DELLA_EPSILON)),
    "della_linear": MethodMap("della_linear", (*_SPARSE, DELLA_EPSILON)),
    "model_stock": MethodMap("model_stock", ()),
    "ram": MethodMap("ram", (RAM_EPSILON,)),
    "ramplus_tl": MethodMap(
        "ram+",
        (
            Param("r", "r", "shared", "float", varying=True),
            Param("alpha", "alpha", "shared", "float", varying=True),
            RAM_EPSILON,
        ),
        fixed=(("rho_scope", "tensor"),),
        implied=(("alpha", 0.2),),
    ),
    "slerp": MethodMap("slerp", (T,), agents=(1, 1)),
    "nearswap": MethodMap("nearswap", (T,), agents=(1, 1)),
    "arcee_fusion": MethodMap("arcee_fusion", (), agents=(1, 1)),
    "sce": MethodMap("sce", (Param("select_topk", "select_topk", "shared", "float", 1.0, varying=True),)),
    "nuslerp": MethodMap(
        "nuslerp",
        (
            VARYING_WEIGHT,
            Param("nuslerp_row_wise", "nuslerp_row_wise", "shared", "bool", False),
            Param("nuslerp_flatten", "nuslerp_flatten", "shared", "bool", True),
        ),
        base="optional",
        agents=(2, 2),
    ),
    "multislerp": MethodMap(
        "multislerp",
        (VARYING_WEIGHT, Param("normalize_weights", "normalize_weights", "shared", "bool", True)),
        base="optional",
    ),
    "karcher": MethodMap(
        "karcher",
        (Param("max_iter", "max_iter", "shared", "float", 10), Param("tol", "tol", "shared", "float", 1e-5)),
        base="optional",
    ),
}


# Parameters mergekit declares that ramstream takes at mergekit's default only: ones that change
# nothing for that method (density and rescale without sparsification; int8_mask, a storage
# choice) and model_stock's filter_wise. Configs written for mergekit load; other values are refused.
_INERT = "has no effect with {method} (mergekit ignores it too)"


DEFAULT_ONLY: dict[str, dict[str, tuple[Param, str]]] = {
    "task_arithmetic": {
        "density": (Param("density", "density", "model", "float", 1.0), _INERT),
        "rescale": (Param("rescale", "rescale", "shared", "bool", False), _INERT),
        "int8_mask": (INT8_MASK, _INERT),
    },
    **{
        m: {"int8_mask": (INT8_MASK, _INERT)}
        for m in ("ties", "dare_linear", "dare_ties", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear", "sce")
    },
    "multislerp": {"eps": (Param("eps", "eps", "shared", "float", 1e-8), "is not supported: only eps: 1e-8")},
    "model_stock": {
        "filter_wise": (
            Param("filter_wise", "filter_wise", "shared", "bool", False),
            "is not supported: only filter_wise: false (one interpolation ratio per tensor)",
        )
    },
}


REFUSED_KEYS = {
    "modules": "modules are not supported: ramstream merges whole models listed under models:",
    "tokenizer": "tokenizer merging is not supported: the tokenizer files are copied from base_model",
    "chat_template": "chat_template is not supported: the tokenizer files are copied from base_model as they are",
}


TOP_KEYS = (
    "merge_method",
    "base_model",
    "models",
    "slices",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
)


OUT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


# What the CLI calls each setting, for messages about clashes between a config and flags.
FLAGS = {
    "method": "--method",
    "r": "--r",
    "alpha": "--alpha",
    "rho_scope": "--rho-scope",
    "lambda_rule": "--lambda-rule",
    "eps": "--eps",
    "out_dtype": "--out-dtype",
    "weights": "--weights",
    "lambda": "--lambda",
    "density": "--density",
    "gamma": "--gamma",
    "epsilon": "--epsilon",
    "base_weight": "--base-weight",
    "seed": "--seed",
    "normalize": "--normalize/--no-normalize",
    "trim_scope": "--trim-scope",
    "rescale": "--rescale",
    "t": "--t",
    "no_base": "--no-base",
    "normalize_weights": "--normalize-weights",
    "nuslerp_row_wise": "--nuslerp-row-wise",
    "nuslerp_flatten": "--nuslerp-flatten",
    "max_iter": "--max-iter",
    "tol": "--tol",
    "select_topk": "--select-topk",
    "index": "--index",
    "allow_nonfinite": "--allow-nonfinite",
}


API_KEYS = ("method", "r", "alpha", "rho_scope", "lambda_rule", "eps", "out_dtype")


PASSTHROUGH = "passthrough"


SCALE = Param("scale", "scale", "model", "float", varying=True)  # no default: unscaled
