"""AttributeDict: keys read as attributes (`hparams.lr`), and it stays a dict for JSON and copies."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from ktrainer.utils.attribute_dict import AttributeDict

pytestmark = pytest.mark.both_backends


def test_keys_read_and_write_as_attributes_and_a_missing_one_names_what_is_there():
    params = AttributeDict(lr=0.1)
    params.width = 8
    assert (params.lr, params["width"]) == (0.1, 8)
    del params.width
    with pytest.raises(AttributeError, match=r"no hyperparameter 'width'; recorded: \['lr'\]"):
        params.width  # noqa: B018 - the attribute access is what is tested


def test_it_is_still_a_dict_to_json_pickle_and_copy():
    params = AttributeDict(lr=0.1, layers=[1, 2])
    assert json.loads(json.dumps(params)) == {"lr": 0.1, "layers": [1, 2]}
    for twin in (pickle.loads(pickle.dumps(params)), copy.deepcopy(params)):
        assert twin == params and twin.lr == 0.1 and isinstance(twin, AttributeDict)
    assert not hasattr(params, "missing")  # getattr's default works: AttributeError, not KeyError
