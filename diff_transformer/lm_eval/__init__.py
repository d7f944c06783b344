"""lm-evaluation-harness model `diff_transformer` (a TemplateLM over a training run's checkpoint).

`python -m diff_transformer.lm_eval --model_args workdir=RUN[,step=N,batch_size=B] --tasks ...`
registers the model and hands every other flag to lm-eval's own command line. Importing
`diff_transformer.lm_eval.model` registers it for
`lm_eval.simple_evaluate(model="diff_transformer")`.
"""
