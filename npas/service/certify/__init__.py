"""The fidelity certificate (`npas validate`): which allocations to retrain (`targets`), retraining them
at full fidelity on the test split (`retrain`), and the certificate with its rank statistics
(`certificate`, `fidelity`)."""
