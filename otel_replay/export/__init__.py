"""Export layer: attribution results as JSON and HTML reports and terminal tables."""
