"""The pure core: specs, the loop's decisions, critique parsing, templates, results,
usage, prices and budget arithmetic. No celery, redis, SDK, network, clock or environment
(``tests/pure/test_structure.py`` checks the whole folder)."""
