"""The report: rows from the measured files, tables, plots, the pipeline table, and the figures published into
the README.
"""
