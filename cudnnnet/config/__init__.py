"""The training configuration: its schema (``schema``), the YAML reader, ``--set`` overrides and
the configs shipped with the package (``shipped``)."""
