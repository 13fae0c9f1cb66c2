"""Scripts that write fixtures/producers/<name>/ with the real producers (torch's own writers).

Each ``<name>.py`` here is run by hand (``python -m devtools.producer_fixtures.<name>``) and
writes ``fixtures/producers/<name>/`` plus its README (producer, torch version, date): the tests
read those files and never run the producers themselves (see :mod:`.common`).
"""
