"""What tools/train.py and tools/test.py share: config and launcher handling (``launch``)."""
