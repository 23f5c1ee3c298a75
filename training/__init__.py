"""Link-token training and the answer-quality evaluation harness."""
