// Copy buttons: an enhancement; without JavaScript the secret is selectable text and the
// buttons stay hidden.
document.querySelectorAll("[data-copy]").forEach((button) => {
  const source = document.querySelector(button.dataset.copy);
  if (!source || !navigator.clipboard) return;
  button.hidden = false;
  button.addEventListener("click", async () => {
    await navigator.clipboard.writeText(source.textContent.trim());
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  });
});
