# What tests/e2e/test_hf_architectures.sh expects not to work yet, as STAGE:WORDS (the stage it
# fails at, the words its one-line error must hold). Remove a line when the model works.
# shellcheck disable=SC2034
UNSUPPORTED=(
)
