"""Graph repairs, one module each (see base.py for the contract and pipeline.graph.repairs for
how they are found and run). base.py and util.py are the shared contract and helpers."""
