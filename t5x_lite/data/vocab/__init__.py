"""Vocabularies: a Hugging Face tokenizer's files and the seqio vocabularies made of them.

Owns:
  tokenizer_files.py   a Hugging Face tokenizer's files: which file a path names, its special ids, the
                       decoder start (BOS, else EOS), whether id 0 is a real token; MODEL_DIR/hf/'s
  tokenizer_json.py    `TokenizerJsonVocabulary`: a tokenizer.json as a seqio vocabulary (Python and TF)
  hf_sentencepiece.py  `HfSentencePieceVocabulary`: a model's SentencePiece tokenizer.model, its own ids
  hf_vocabulary.py     those vocabularies from a path, a prepared directory or a model directory

May import: data/records/, storage, errors, tf_setup.
"""
