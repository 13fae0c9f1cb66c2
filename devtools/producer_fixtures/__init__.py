"""Scripts that write fixtures/producers/<name>/ with the real producers' own save code.

Other trainers (torchtitan, PyTorch's DCP recipe) through ``bin/make-producer-fixtures``; torch's
own writers (HF storage, dtypes, zstd, rank-local metadata) as ``python -m
devtools.producer_fixtures.<name>``. Each writes ``fixtures/producers/<name>/`` plus its README
(producer, versions, command): the tests read those files and never run the producers themselves.
"""
