from setuptools import find_packages, setup

setup(name='mmeffvit', version='0.1.0', packages=find_packages(include=['mmeffvit', 'mmeffvit.*']))
