"""Complexity analysis: MACs and parameters by tracing (tools/analysis/get_flops.py)."""
from .complexity import ComplexityReport, analyze, count_params, format_report
from .models import (ImageNetClassifier, backbone_complexity, build_backbone, build_classifier,
                     config_complexity)

__all__ = [
    'ComplexityReport', 'ImageNetClassifier', 'analyze', 'backbone_complexity', 'build_backbone',
    'build_classifier', 'config_complexity', 'count_params', 'format_report'
]
