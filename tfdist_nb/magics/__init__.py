"""The thin IPython surface: parse the magic line, validate it fully, hand off to ``Cluster``."""
