"""The model zoo as data: variants, config reading, cached counts, published results and the model
index (metafiles, family README sections) that ``tools/analysis/model_zoo.py`` writes.

Not imported by :mod:`mmeffvit.analysis` itself: only the tool and the tests need it.
"""
