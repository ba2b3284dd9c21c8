"""The anomaly guard's host side (`train.anomaly`), a trainer hook. The compiled step already skips updates
whose gradient norm or loss spike (ms_llm.train.step); this logs each skip and, after `max_nonfinite`
consecutive non-finite steps, rolls back to the newest checkpoint and lowers the learning rate."""
from ms_llm.checkpoint import state as ckpt_state
from ms_llm.checkpoint import store
from ms_llm.train.loop.hooks import Hook


class AnomalyRollback(Hook):
    def __init__(self, anomaly_cfg):
        self.cfg = anomaly_cfg
        self.nonfinite_run = 0  # consecutive steps with non-finite gradients

    def after_step(self, run, step, out, batches):
        a, done = self.cfg, step + 1
        code = int(out.code.asnumpy())  # one host sync per step: the guard acts on the step it sees
        if code == 2:
            run.writer.write({"step": done, "event": "anomaly_skip", "reason": f"grad norm or loss z-score > "
                              f"{a.zscore:g}", "loss": float(out.loss.asnumpy()),
                              "grad_norm": float(out.grad_norm.asnumpy())})
        self.nonfinite_run = self.nonfinite_run + 1 if code == 1 else 0
        if self.nonfinite_run >= a.max_nonfinite:
            self.roll_back(run, done)
            self.nonfinite_run = 0

    def roll_back(self, run, done):
        import mindspore as ms

        s, log = run.session, run.log
        directory = store.rank_dir(run.run_dir, run.ckpt_rank)
        step, manifest = store.newest_valid(directory, warn=log)
        if step is None:
            log(f"warning: {self.nonfinite_run} consecutive non-finite steps and no checkpoint to roll back to; "
                f"continuing")
            return
        path = store.checkpoint_path(directory, manifest)
        ckpt_state.restore(s, store.read_tensors(path), path)
        st = s.step_fn.state
        lr_scale = float(st.lr_scale.asnumpy()) * self.cfg.lr_factor
        st.lr_scale.set_data(ms.Tensor(lr_scale, ms.float32))
        st.global_step.set_data(ms.Tensor(done, ms.int32))  # the schedule keeps following the step count
        run.writer.write({"step": done, "event": "rollback", "to_step": step, "lr_scale": lr_scale,
                          "reason": f"{self.nonfinite_run} consecutive non-finite steps"})
        log(f"anomaly guard: {self.nonfinite_run} consecutive non-finite steps; rolled back to step {step}'s "
            f"weights, learning rate × {lr_scale:g}; the data continues past the bad batches")
