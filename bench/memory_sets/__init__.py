"""Labelled conversations for the memory bench's extraction part (issue 28 part 4).

Written by hand before the extractor was tuned (bench/memory_sets/dev.py: the tuning part;
bench/memory_sets/heldout.py: never looked at while tuning). Each conversation is a dict:

- ``id``: a short name;
- ``turns``: ``[(user message, assistant answer), ...]`` oldest first (the answers often say
  things in the first person, to catch an extractor that reads them);
- ``expect``: the facts a person would accept, each a list of keywords that must all appear
  (case-insensitive) in one stored fact's text; ``[]``: nothing may be stored (essays,
  translations, stories, role-play, questions about the world).

Scoring (bench/memory_extraction.py): a stored fact is *correct* when it matches an expected
fact not matched yet; precision = correct / stored, recall = matched expected / expected.
"""
