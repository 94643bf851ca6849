// oases-train MODEL [--data F | --inputs DIR | --synthetic] [--steps N] [--batch B --seq T]
//   [--optimizer sgd|adamw --lr ...] [--save CKPT] [--resume CKPT] [--export-onnx OUT.onnx]
//   [--dump-grads DIR] [--log-json FILE] [--tp T --dp D] [--local-ranks N] [--plan plan.json]
// Trains an imported model on one rank, on N ranks as threads, or under mpirun/srun.
#include "tools/train_driver.h"

using namespace oases;

int main(int argc, char** argv) {
  return run_tool([&] {
    TrainArgs a;
    CLI::App app{"oases-train: train an ONNX transformer on one or many ranks"};
    add_train_options(app, a);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    return run_training(a, argc, argv);
  });
}
