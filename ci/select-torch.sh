# Sourced by ci/test and ci/main: picks the libtorch to build against from DTENSOR_TORCH and
# sets BUILD (unless set), TORCH_CMAKE_ARGS (extra cmake arguments) and TORCH_PREFIX.
#   DTENSOR_TORCH=system (default)   the system libtorch (Debian's), build dir build/
#   DTENSOR_TORCH=wheel              today's PyTorch wheel (ci/torch-wheel, pinned in
#                                    ci/pytorch-version), build dir build-torch/
TORCH_CMAKE_ARGS=()
TORCH_PREFIX=""
case "${DTENSOR_TORCH:-system}" in
  system) BUILD=${BUILD:-build} ;;
  wheel)
    TORCH_PREFIX=$(bash ci/torch-wheel)
    BUILD=${BUILD:-build-torch}
    TORCH_CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$TORCH_PREFIX")
    ;;
  *) echo "ci: DTENSOR_TORCH='${DTENSOR_TORCH}' is not 'system' or 'wheel'" >&2; exit 2 ;;
esac
