"""RUN/embedding.json: written and read back, and a damaged or unsupported one is a clear error."""

from __future__ import annotations

import json

import pytest

from ember.errors import EmberError
from ember.runs.embedding import EmbeddingDefaults, read_embedding_defaults, write_embedding_defaults


def test_embedding_defaults_round_trip_and_absent_file(tmp_path):
    assert read_embedding_defaults(tmp_path) is None  # no file: the callers' own defaults (mean, unnormalised)
    written = EmbeddingDefaults("cls", True, 256, "sentence-transformers: modules.json")
    write_embedding_defaults(tmp_path, written)
    assert read_embedding_defaults(tmp_path) == written
    data = json.loads((tmp_path / "embedding.json").read_text())
    (tmp_path / "embedding.json").write_text(json.dumps({**data, "from_a_newer_ember": 1}))
    assert read_embedding_defaults(tmp_path) == written  # unknown keys are ignored


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    ('["mean"]', "expected a JSON object"),
    ('{"pooling": "max"}', "pooling 'max' is not one ember computes"),
    ('{"normalize": "yes"}', "normalize must be true or false"),
    ('{"max_length": -1}', "max_length must be a whole number"),
])
def test_bad_embedding_file_says_what_is_wrong(tmp_path, content, message):
    (tmp_path / "embedding.json").write_text(content)
    with pytest.raises(EmberError, match=message):
        read_embedding_defaults(tmp_path)
    with pytest.raises(EmberError, match="pooling 'none'"):
        write_embedding_defaults(tmp_path, EmbeddingDefaults("none"))
