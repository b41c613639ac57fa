"""The index page's sections, one module each with its template beside it (reports/index_sections.py loads them)."""
