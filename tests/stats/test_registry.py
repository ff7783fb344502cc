"""Registry-driven tests: every statistic's declared properties, and registry coverage."""

import doctest
import importlib
import inspect

import numpy as np
import pytest
from scipy.stats import special_ortho_group

from attnbase.stats import registry
from attnbase.stats.registry import HELPERS, INPUT_KINDS, NULLS, STATISTICS

STATS = sorted(STATISTICS)


def with_property(prop):
    return [n for n in STATS if getattr(STATISTICS[n], prop)]


def sample(kind, rng):
    """A random input of each kind, with some structure (anisotropy, a sink) so nothing is trivial."""
    if kind in ("keys", "keys_seq"):
        scale = np.geomspace(0.2, 5.0, 12)
        x = rng.standard_normal((2, 4, 24, 12)) * scale  # (kv_head, seq, pos, d_head)
        x[:, :, 0] *= 3.0
        return x if kind == "keys" else x.reshape(-1, 24, 12)
    if kind == "attn":
        z = rng.standard_normal((2, 3, 4, 16, 16))  # (layer, head, seq, query, key)
        z[..., 0] += 2.0
        z[..., np.triu_indices(16, 1)[0], np.triu_indices(16, 1)[1]] = -np.inf
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if kind == "attn_tokens":  # (head, seq, query, key) and (seq, pos) with repeats
        return (sample("attn", rng)[0], rng.integers(0, 5, size=(4, 16)))
    if kind == "profile":
        return rng.uniform(0, 0.5, size=(6, 4))
    if kind == "logit_rows":
        z = rng.standard_normal((3, 16, 16)) * 2.0  # (head, query, key), causal prefix
        z[..., 0] += 3.0
        z[..., np.triu_indices(16, 1)[0], np.triu_indices(16, 1)[1]] = -np.inf
        return z[:, 2:]  # rows with n >= 3 keys: every compositional quantity is defined
    if kind == "logit_row_pairs":
        return (sample("logit_rows", rng), sample("logit_rows", rng))
    if kind == "hidden":
        x = rng.standard_normal((2, 3, 12, 8)) * np.geomspace(0.5, 4.0, 8)  # (seq.., pos, d_model)
        x[..., 0, :] *= 5.0  # a massive first token
        return x
    if kind == "qk":
        return (rng.standard_normal((3, 16, 4)), rng.standard_normal((3, 16, 4)))
    if kind == "distance_pairs":
        def dist():
            p = rng.standard_normal((7, 3))
            return np.sqrt(((p[:, None] - p[None]) ** 2).sum(-1))
        return (dist(), dist())
    raise AssertionError(kind)


def call(stat, x):
    out = stat.func(*x) if isinstance(x, tuple) else stat.func(x)  # pairs: two arguments
    if stat.result:
        out = getattr(out, stat.result)
    return np.asarray(out, dtype=float)


def _each(x, f):
    return tuple(f(a) for a in x) if isinstance(x, tuple) else f(x)


@pytest.mark.parametrize("name", STATS)
def test_registered_metadata(name):
    s = STATISTICS[name]
    assert s.name == name and s.input in INPUT_KINDS and callable(s.func)
    assert s.func.__doc__ and "docs/metrics.md" in (inspect.getmodule(s.func).__doc__ + s.func.__doc__
                                               + s.reference)
    assert "Examples" in s.func.__doc__, "every statistic carries a closed-form doctest"


@pytest.mark.parametrize("name", [n for n in STATS if STATISTICS[n].bounds])
def test_bounded(name, rng):
    s = STATISTICS[name]
    lo, hi = s.bounds
    for _ in range(3):
        v = call(s, sample(s.input, rng))
        assert np.all((v >= lo - 1e-12) & (v <= hi + 1e-12)), v


@pytest.mark.parametrize("name", with_property("scale_invariant"))
@pytest.mark.parametrize("c", [1e-3, 0.5, 7.0, 1e4])
def test_scale_invariant(name, c, rng):
    s = STATISTICS[name]
    x = sample(s.input, rng)
    np.testing.assert_allclose(call(s, _each(x, lambda a: c * a)), call(s, x), rtol=1e-9)


@pytest.mark.parametrize("name", with_property("rotation_invariant"))
def test_rotation_invariant(name, rng):
    s = STATISTICS[name]
    x = sample(s.input, rng)
    q = special_ortho_group.rvs(_each(x, np.shape)[0][-1] if isinstance(x, tuple) else x.shape[-1],
                                random_state=1)
    np.testing.assert_allclose(call(s, _each(x, lambda a: a @ q)), call(s, x), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("name", with_property("token_permutation_invariant"))
def test_token_permutation_invariant(name, rng):
    s = STATISTICS[name]
    x = sample(s.input, rng)
    perm = rng.permutation(x.shape[-2])
    np.testing.assert_allclose(call(s, x[..., perm, :]), call(s, x), rtol=1e-9)


@pytest.mark.parametrize("name", with_property("seq_permutation_invariant"))
def test_seq_permutation_invariant(name, rng):
    s = STATISTICS[name]
    x = sample(s.input, rng)
    axis = x.ndim - 3
    perm = rng.permutation(x.shape[axis])
    np.testing.assert_allclose(call(s, np.take(x, perm, axis=axis)), call(s, x), rtol=1e-9)


@pytest.mark.parametrize("name", with_property("shift_invariant"))
@pytest.mark.parametrize("c", [-30.0, 0.7, 25.0])
def test_shift_invariant(name, c, rng):
    # softmax forgets a constant added to a row's logits; so must every statistic of p
    s = STATISTICS[name]
    x = sample(s.input, rng)
    np.testing.assert_allclose(call(s, _each(x, lambda z: z + c)), call(s, x), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("name", with_property("sink_invariant"))
def test_sink_invariant(name, rng):
    # moving the sink logit changes the sink mass only: content statistics must not notice
    s = STATISTICS[name]
    x = sample(s.input, rng)

    def move(z):
        z = z.copy()
        z[..., 0] += rng.uniform(-8, 8, size=z.shape[:-1])
        return z

    np.testing.assert_allclose(call(s, _each(x, move)), call(s, x), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", with_property("symmetric"))
def test_symmetric(name, rng):
    s = STATISTICS[name]
    a, b = sample(s.input, rng)
    np.testing.assert_allclose(call(s, (b, a)), call(s, (a, b)), rtol=1e-12)
    np.testing.assert_allclose(call(s, (a, a)), 0.0, atol=1e-12)


def test_sink_dependence_is_declared_honestly(rng):
    # d_A does see the sink: a declared sink_invariant=False must be real
    s = STATISTICS["aitchison"]
    a, b = sample(s.input, rng)
    a2 = a.copy()
    a2[..., 0] += 2.0
    assert not np.allclose(call(s, (a2, b)), call(s, (a, b)))


def test_non_invariance_is_declared_honestly(rng):
    # the excl-sink CV does depend on which token is first: a declared False must be real
    s = STATISTICS["key_norm_cv_excl_sink"]
    x = sample("keys", rng)
    assert not np.allclose(call(s, x[..., ::-1, :]), call(s, x))


def test_registry_covers_every_public_name_of_the_family_modules():
    for mod in registry.FAMILY_MODULES:
        public = {n for n, obj in vars(mod).items()
                  if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                  and getattr(obj, "__module__", None) == mod.__name__}
        assert public <= set(mod.__all__), f"{mod.__name__}: public but not in __all__: " \
                                           f"{public - set(mod.__all__)}"
        registered = {s.func.__name__ for s in STATISTICS.values()}
        nulls = {f.__name__ for f, _ in NULLS.values()}
        missing = set(mod.__all__) - registered - nulls - set(HELPERS)
        assert not missing, f"{mod.__name__}: register these in stats/registry.py: {missing}"


def test_helpers_and_nulls_exist():
    names = {n for m in registry.FAMILY_MODULES for n in m.__all__}
    assert set(HELPERS) <= names
    assert {f.__name__ for f, _ in NULLS.values()} <= names


def test_unknown_statistic_lists_valid_names():
    from attnbase.errors import StatsError

    with pytest.raises(StatsError, match="key_norm_cv"):
        registry.get_statistic("nope")


STATS_MODULES = ["norms", "geometry", "concentration", "inference", "compositional", "registry", "views",
                 "queries", "analyze", "highnorm", "rollout"]


@pytest.mark.parametrize("name", STATS_MODULES)
def test_doctests(name):
    mod = importlib.import_module(f"attnbase.stats.{name}")
    res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0
