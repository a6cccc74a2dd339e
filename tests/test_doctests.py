"""Every docstring ``Example`` in mmeffvit runs and prints what it shows (a doctest each)."""
import doctest
import importlib
import pkgutil

import pytest
import torch

import mmeffvit


def _docstrings_with_examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for info in pkgutil.walk_packages(mmeffvit.__path__, 'mmeffvit.'):
        module = importlib.import_module(info.name)
        for test in finder.find(module, info.name):
            # a class docstring is found again through every module that imports the class
            if test.examples and test.name.startswith(info.name + '.'):
                found.append(test)
    return sorted(found, key=lambda t: t.name)


DOCTESTS = _docstrings_with_examples()


def test_every_backbone_documents_a_runnable_example():
    from mmeffvit.models import backbones
    names = {t.name.rsplit('.', 1)[-1] for t in DOCTESTS}
    assert set(backbones.__all__) - {'EffBackbone'} <= names


@pytest.mark.parametrize('test', DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_example(test):
    report = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    torch.manual_seed(0)
    result = runner.run(test, out=report.append)
    assert result.failed == 0, ''.join(report)
