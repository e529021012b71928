"""optimize's options object (tf_fusionstitch/options.py): keyword-only, checked
once where it is made, with errors that name the option and the fix. TF-free."""

import dataclasses

import pytest

from tf_fusionstitch import kernels
from tf_fusionstitch.options import NOT_IN_CACHE_KEY, STRATEGIES, TARGETS, FusionOptions


def test_defaults_are_valid_and_the_fields_are_keyword_only():
    options = FusionOptions()
    assert options.fusion == "stitch" and options.min_cluster_ops == 2
    with pytest.raises(TypeError):
        FusionOptions(3, 2)   # two ints that positional arguments could swap


@pytest.mark.parametrize("given, error, words", [
    (dict(min_cluster_ops="2"), TypeError, "min_cluster_ops='2'"),
    (dict(pack=1), TypeError, "pack=1"),
    (dict(min_cluster_ops=True), TypeError, "min_cluster_ops=True"),
    (dict(fusion="xla"), ValueError, "'stitch', 'xla_like', 'explore'"),
    (dict(min_cluster_ops=0), ValueError, "at least 1"),
    (dict(fusion="explore", explore_k=9), ValueError, "expected 1 to 8"),
    (dict(measured_choice=-1), ValueError, "expected 0 to 1000"),
    (dict(target="cuda"), ValueError, "'cpu', 'cuda-emulated'"),
])
def test_a_bad_value_names_the_option_and_what_it_takes(given, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        FusionOptions(**given)


@pytest.mark.parametrize("given, words", [
    (dict(fusion="xla_like", pack=False), "drop pack"),
    (dict(explore_k=4), "applies only to fusion='explore'"),
    (dict(costs="builtin"), "pass fusion='explore' or drop costs"),
    (dict(target="cuda-emulated", pack=True), "pack=True applies to target='cpu'"),
])
def test_from_call_refuses_options_the_strategy_ignores(given, words):
    FusionOptions(**given)   # each value is valid on its own
    with pytest.raises(ValueError, match=words):
        FusionOptions.from_call(**given)


def test_from_call_names_an_unknown_option_and_lists_the_known():
    with pytest.raises(TypeError, match="unknown option 'fuse'.*min_cluster_ops"):
        FusionOptions.from_call(fuse="stitch")


def test_the_cache_key_holds_what_changes_the_rewritten_graph():
    key = FusionOptions(fusion="explore", measured_choice=3).cache_key()
    assert key["fusion"] == "explore"
    assert not set(NOT_IN_CACHE_KEY) & set(key)
    assert set(key) | set(NOT_IN_CACHE_KEY) == {f.name for f in dataclasses.fields(FusionOptions)}


def test_every_option_has_help_text_and_the_strategies_are_named():
    assert all(FusionOptions.help().values())
    assert STRATEGIES == ("stitch", "xla_like", "explore")


def test_the_gpu_target_launches_a_kernel_per_cluster_so_does_not_pack():
    assert FusionOptions.from_call().pack
    assert not FusionOptions.from_call(target="cuda-emulated").pack
    assert not FusionOptions.from_call(target="cuda-emulated", pack=False).pack
    assert TARGETS == kernels.TARGETS
