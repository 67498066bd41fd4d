"""The face of Duet: the ``duet`` command, batch inputs and config files, the HTML report,
the embedded default and the stand-in LLM server. It sits on top of ``orchestration`` and
``workers``; nothing below imports it."""

#: The distribution's name (``duet`` on the index is another project). Not published on
#: the index yet: Duet installs from its repository at a tag (README). The import packages
#: keep their names.
DISTRIBUTION = "duet-review"
