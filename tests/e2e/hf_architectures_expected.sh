# What tests/e2e/test_hf_architectures.sh expects not to work yet, as STAGE:WORDS (the stage it
# fails at, the words its one-line error must hold). Remove a line when the model works.
# shellcheck disable=SC2034
UNSUPPORTED=(
  # ALiBi attention is not fused, so tp finds no block to split (forward and gradients work)
  [dynamo_bloom]="tp:no transformer block was recognised"
  [torchscript_bloom]="tp:no transformer block was recognised"
  # multi-query attention: K/V heads are not replicated when tp exceeds them
  [dynamo_falcon]="tp:does not divide its 1 key/value heads"
  [torchscript_falcon]="tp:does not divide its 1 key/value heads"
  [torchscript_gemma]="tp:does not divide its 1 key/value heads"
)
