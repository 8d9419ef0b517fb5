"""Vocabularies: SentencePiece models and Hugging Face tokenizers, in Python and as seqio's.

Owns:
  base.py                     `Vocabulary`: seqio's Python interface (encode, decode through the first
                              EOS, vocab_size, special ids, extra_ids) without TensorFlow
  sentencepiece_vocabulary.py `SentencePieceVocabulary`: a SentencePiece model with seqio's ids (prepare's
                              spm.model) or a Hugging Face folder's (a tokenizer.model)
  tokenizer_json.py           `TokenizerJsonVocabulary`: a tokenizer.json with its folder's ids
  tokenizer_files.py          a Hugging Face tokenizer's files: which file a path names, its special ids, the
                              decoder start (BOS, else EOS), whether id 0 is a real token; MODEL_DIR/hf/'s
  hf_vocabulary.py            those vocabularies from a path, a prepared directory or a model directory
  seqio_vocabularies.py       `as_seqio`: the seqio vocabulary (Python and TF) of any of them, for seqio's
                              tasks and tf.data

Only seqio_vocabularies.py imports TensorFlow or seqio: the rest reads, encodes and decodes text
where neither is installed (training on a prepared directory, sample, eval, infer).

May import: data/records/, storage, errors, tf_setup (seqio_vocabularies.py alone).
"""
