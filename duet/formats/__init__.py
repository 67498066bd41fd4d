"""Results records as the formats code-review tools read: SARIF, rdjson, GitHub
annotations, a Markdown summary and a patch of the approved revisions. Pure."""
