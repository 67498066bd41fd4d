"""The face of Duet: the ``duet`` command, batch inputs and config files, the HTML report,
the embedded default and the stand-in LLM server. It sits on top of ``orchestration`` and
``workers``; nothing below imports it."""

#: The name Duet is published under on the package index (``pip install duet-review``);
#: ``duet`` there is another project. The import packages keep their names.
DISTRIBUTION = "duet-review"
