"""What tools/train.py and tools/test.py share.

``launch`` (configs, launchers, CPU distributed setup), ``cpu_sync_bn`` (SyncBN for gloo process
groups), ``hooks`` (exact resume, non-finite loss guard), ``resume`` (which checkpoint --resume
takes), ``data_checks`` and ``errors`` (bad input named, CLI error reporting).
"""
