"""A batch's result records, their summary and CSV, and the HTML report a reviewer triages from."""
