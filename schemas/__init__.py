"""The ledger's Avro schemas: one ``.avsc`` per event kind, older versions in ``history/``.

A package only so that the files ship inside the wheel and load with
:mod:`importlib.resources` (see :mod:`ledger.serde`); it holds no code.
"""
